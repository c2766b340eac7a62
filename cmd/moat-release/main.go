// Command moat-release builds the OCI image of a moat release (`make
// release`, see internal/release) from moat binaries already built, one
// per platform:
//
//	moat-release --ref moat:v0.3.0 --version v0.3.0 --commit <sha> \
//		--created 2026-01-01T00:00:00Z --layout dist/oci --archive dist/moat-v0.3.0-oci.tar \
//		linux/amd64=dist/linux-amd64/moat linux/arm64=dist/linux-arm64/moat
//
// It is a binary of its own, not linked into moat.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/release"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "moat-release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("moat-release", flag.ContinueOnError)
	ref := fs.String("ref", "moat:latest", "image name the layout's entry carries")
	version := fs.String("version", "", "release version (image label)")
	commit := fs.String("commit", "", "commit (image label)")
	created := fs.String("created", "", "creation time, RFC 3339 (default: the Unix epoch, for reproducible builds)")
	layoutDir := fs.String("layout", "", "OCI image layout directory to write (required; must not exist or be empty)")
	archive := fs.String("archive", "", "also write the layout as this tar (an oci-archive)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *layoutDir == "" || fs.NArg() == 0 {
		return fmt.Errorf("usage: moat-release --layout DIR [--archive FILE] [--ref REF] OS/ARCH=BINARY (one or more)")
	}
	img := release.Image{Binaries: map[string]string{}, Version: *version, Commit: *commit, Created: time.Unix(0, 0).UTC()}
	if *created != "" {
		t, err := time.Parse(time.RFC3339, *created)
		if err != nil {
			return fmt.Errorf("--created: %w", err)
		}
		img.Created = t.UTC()
	}
	for _, a := range fs.Args() {
		p, bin, ok := strings.Cut(a, "=")
		if !ok || bin == "" {
			return fmt.Errorf("%q: want OS/ARCH=BINARY", a)
		}
		img.Binaries[p] = bin
	}
	idx, err := release.Build(img)
	if err != nil {
		return err
	}
	if err := release.WriteLayout(*layoutDir, *ref, idx); err != nil {
		return err
	}
	if *archive != "" {
		return release.WriteArchive(*layoutDir, *archive, img.Created)
	}
	return nil
}
