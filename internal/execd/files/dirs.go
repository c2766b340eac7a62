package files

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// ListDir serves GET /directories/list: it lists a directory to the given depth (default 1) in
// lexical order; symlinks are reported as such and not followed.
func (s *Service) ListDir(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		return wire.MissingQuery("path")
	}
	depth := 1
	if v := q.Get("depth"); v != "" {
		d, err := strconv.Atoi(v)
		if err != nil || d < 1 {
			return errdefs.Invalid(wire.CodeInvalidRequestBody, "depth must be a positive integer")
		}
		depth = d
	}
	root := s.run.Expand(p)
	fi, err := os.Lstat(root)
	if err != nil {
		return lookupError(err, "error listing directory")
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return errdefs.Invalid(wire.CodeInvalidFile, root+" is a symlink")
	}
	if !fi.IsDir() {
		return errdefs.Invalid(wire.CodeInvalidFile, root+" is not a directory")
	}
	out := []FileInfo{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if level > 1 && errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return err
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, e := range entries {
			ep := filepath.Join(dir, e.Name())
			info, err := e.Info()
			if err != nil {
				continue
			}
			out = append(out, toFileInfo(ep, info))
			if e.IsDir() && level < depth {
				if err := walk(ep, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return fileError(err, "error listing directory")
	}
	return wire.WriteJSON(w, out)
}

// Mkdir serves POST /directories: mkdir -p with mode and owner.
func (s *Service) Mkdir(w http.ResponseWriter, r *http.Request) error {
	var req map[string]Permission
	if err := wire.DecodeBody(r, &req, false); err != nil {
		return err
	}
	for p, perm := range req {
		mode, err := parseMode(perm.Mode, 0o755)
		if err != nil {
			return err
		}
		uid, gid, err := resolveOwner(perm.Owner, perm.Group)
		if err != nil {
			return err
		}
		fp := s.run.Expand(p)
		if err := os.MkdirAll(fp, mode); err != nil {
			return fileError(err, "error creating directory")
		}
		if perm.Mode != 0 {
			if err := os.Chmod(fp, mode); err != nil {
				return fileError(err, "error creating directory")
			}
		}
		if err := chownIDs(fp, uid, gid); err != nil {
			return fileError(err, "error creating directory")
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// Rmdir serves DELETE /directories: rm -r of each path (never /).
func (s *Service) Rmdir(w http.ResponseWriter, r *http.Request) error {
	paths, err := queryPaths(r)
	if err != nil {
		return err
	}
	for _, p := range paths {
		fp := s.run.Expand(p)
		if fp == "/" {
			return errdefs.Invalid(wire.CodeInvalidFile, "refusing to remove /")
		}
		if err := os.RemoveAll(fp); err != nil {
			return fileError(err, "error removing directory")
		}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}
