package envd

import (
	"encoding/base64"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// account is the Linux user a request acts as, from the sandbox's
// /etc/passwd and /etc/group.
type account struct {
	name     string
	uid, gid int
	groups   []uint32 // supplementary gids
	home     string
}

// lookupAccount finds a user by name.
func lookupAccount(name string) (account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return account{}, errdefs.Newf(errdefs.ErrUnauthenticated, "invalid username: '%s'", name)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return account{}, errdefs.Newf(errdefs.ErrUnauthenticated, "invalid username: '%s'", name)
	}
	a := account{name: u.Username, uid: uid, gid: gid, home: u.HomeDir}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				a.groups = append(a.groups, uint32(g))
			}
		}
	}
	if a.home == "" {
		a.home = "/"
	}
	return a, nil
}

// rpcAccount is the user an RPC names with `Authorization: Basic
// base64(name:)`, or the default user.
func (s *Service) rpcAccount(h http.Header) (account, error) {
	name := s.opts.DefaultUser
	if v := h.Get("Authorization"); v != "" {
		scheme, enc, _ := strings.Cut(v, " ")
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
		if !strings.EqualFold(scheme, "Basic") || err != nil {
			return account{}, errdefs.Newf(errdefs.ErrUnauthenticated, "invalid authorization header")
		}
		name, _, _ = strings.Cut(string(raw), ":")
	}
	return lookupAccount(name)
}

// queryAccount is the user a /files request names with ?username=.
func (s *Service) queryAccount(r *http.Request) (account, error) {
	name := r.URL.Query().Get("username")
	if name == "" {
		name = s.opts.DefaultUser
	}
	return lookupAccount(name)
}

// credential is the child credential for a, or nil when the agent already
// runs as a (an unprivileged agent cannot switch users).
func (a account) credential() (*syscall.Credential, error) {
	if os.Getuid() == a.uid && os.Getgid() == a.gid {
		return nil, nil
	}
	if os.Getuid() != 0 {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "the agent cannot run processes as %s", a.name)
	}
	return &syscall.Credential{Uid: uint32(a.uid), Gid: uint32(a.gid), Groups: a.groups}, nil
}

// resolvePath is envd's ExpandAndResolve: an empty path is the default
// workdir (or home), ~ and ~/ expand to the user's home, an absolute path
// stays, and a relative one is joined to the home, never the workdir.
func (s *Service) resolvePath(p string, a account) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "path contains a NUL byte")
	}
	switch {
	case p == "":
		if s.opts.DefaultWorkdir != "" {
			return s.opts.DefaultWorkdir, nil
		}
		return a.home, nil
	case p == "~" || strings.HasPrefix(p, "~/"):
		return filepath.Join(a.home, p[1:]), nil
	case strings.HasPrefix(p, "~"):
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "path '%s': only ~ and ~/ expand, not another user's home", p)
	case filepath.IsAbs(p):
		return filepath.Clean(p), nil
	}
	return filepath.Join(a.home, p), nil
}

// mkdirAll is mkdir -p. Run under account.as, what it creates is the
// account's.
func mkdirAll(dir string) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return errdefs.Newf(errdefs.ErrInvalidArgument, "path '%s' exists and is not a directory", dir)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return fsError(err, dir)
	}
	return nil
}

// DefaultWorkdir is the directory a request that names none starts in:
// the template's workdir, else the default user's home (root's when that
// user is unknown).
func (s *Service) DefaultWorkdir() string {
	if s.opts.DefaultWorkdir != "" {
		return s.opts.DefaultWorkdir
	}
	if a, err := lookupAccount(s.opts.DefaultUser); err == nil {
		return a.home
	}
	return "/root"
}
