package store

import (
	"fmt"
	"strconv"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Schema versions. The state carries the version that last wrote it
// (bucket MetaBucket, key "schema"). Open upgrades an older state through
// the migrations, in one transaction, after copying the file aside; it
// refuses a newer one, so a downgraded server never reads records it does
// not understand or drops fields it does not know.
//
// To change the shape of stored records: bump SchemaVersion and append a
// migration to migrations() that rewrites the old records (decode them
// loosely, as map[string]any, since the old Go types are gone).
const (
	// SchemaVersion is the version of the state this build reads and writes.
	SchemaVersion = 2
	// MetaBucket holds the store's own records.
	MetaBucket = "moat.meta"
	schemaKey  = "schema"
	// GuardPrefix starts the keys of records that are not data (the
	// legacy guard); List and ForEach skip them.
	GuardPrefix = "~"
)

// legacyGuardKey is a record in the sandboxes bucket that servers released
// before schema versions existed (version 1, git f29dccf and older) cannot
// decode: they refuse to start, before their recovery pass could delete
// sandboxes it does not understand, with this key in the message.
const (
	legacyGuardBucket = "sandboxes"
	legacyGuardKey    = GuardPrefix + "moat-state-schema-2: this state was written by a newer moat server; this (older) moat cannot use it: run the newer moat"
)

// migration upgrades the state from version to-1 to to.
type migration struct {
	to    int
	name  string
	apply func(tx *bolt.Tx) error
}

// migrations lists every upgrade step, oldest first.
func migrations() []migration {
	return []migration{
		{to: 2, name: "version the state; guard it against servers that predate versions", apply: putLegacyGuard},
	}
}

// putLegacyGuard stores the record pre-versioning servers fail on: a JSON
// string where they expect a sandbox object.
func putLegacyGuard(tx *bolt.Tx) error {
	bk, err := tx.CreateBucketIfNotExists([]byte(legacyGuardBucket))
	if err != nil {
		return err
	}
	return bk.Put([]byte(legacyGuardKey), []byte(strconv.Quote("upgrade moat: this state has schema version 2")))
}

// Version returns the schema version of the open state.
func (d *DB) Version() (int, error) {
	var v int
	err := d.db.View(func(tx *bolt.Tx) error {
		var err error
		v, err = readVersion(tx)
		return err
	})
	return v, err
}

// readVersion is the recorded version; a state with data but no version
// is version 1 (it predates versions), an empty one is new (0).
func readVersion(tx *bolt.Tx) (int, error) {
	if bk := tx.Bucket([]byte(MetaBucket)); bk != nil {
		if raw := bk.Get([]byte(schemaKey)); raw != nil {
			v, err := strconv.Atoi(string(raw))
			if err != nil || v < 1 {
				return 0, fmt.Errorf("store: corrupt schema version %q: %w", raw, errdefs.ErrInternal)
			}
			return v, nil
		}
	}
	empty := true
	tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		empty = false
		return nil
	})
	if empty {
		return 0, nil
	}
	return 1, nil
}

// upgrade brings the state at path to SchemaVersion (see the constants).
func (d *DB) upgrade(path string) error {
	var from int
	if err := d.db.View(func(tx *bolt.Tx) error {
		var err error
		from, err = readVersion(tx)
		return err
	}); err != nil {
		return err
	}
	switch {
	case from == SchemaVersion:
		return nil
	case from > SchemaVersion:
		return fmt.Errorf("store: %s has schema version %d, but this moat understands versions up to %d: "+
			"it was written by a newer moat server; run that version (downgrades are not supported): %w",
			path, from, SchemaVersion, errdefs.ErrFailedPrecondition)
	case from > 0:
		// Keep the old state: a failed or regretted upgrade can go back.
		backup := fmt.Sprintf("%s.schema%d.bak", path, from)
		if err := d.db.View(func(tx *bolt.Tx) error { return tx.CopyFile(backup, 0o600) }); err != nil {
			return fmt.Errorf("store: back up %s before upgrading it: %w", path, err)
		}
	}
	return d.db.Update(func(tx *bolt.Tx) error {
		for _, m := range migrations() {
			if m.to <= from || m.to > SchemaVersion {
				continue
			}
			if err := m.apply(tx); err != nil {
				return fmt.Errorf("store: migrate %s to schema version %d (%s): %w", path, m.to, m.name, err)
			}
		}
		bk, err := tx.CreateBucketIfNotExists([]byte(MetaBucket))
		if err != nil {
			return err
		}
		return bk.Put([]byte(schemaKey), []byte(strconv.Itoa(SchemaVersion)))
	})
}

// isGuard reports whether key names a record that is not data.
func isGuard(key []byte) bool { return strings.HasPrefix(string(key), GuardPrefix) }
