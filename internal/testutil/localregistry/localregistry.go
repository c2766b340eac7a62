// Package localregistry runs an in-process OCI registry on loopback
// (go-containerregistry's registry) and pushes rootfs directories to it as
// single-layer images. Tests, `moat bench` and demos use it so that nothing
// is ever pulled from a remote registry.
package localregistry

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Registry is a running loopback registry.
type Registry struct {
	// Host is "127.0.0.1:port".
	Host string
	srv  *http.Server
	ln   net.Listener
}

// Start serves a registry on 127.0.0.1 (random port) until Close.
func Start() (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: ln.Addr().String(), ln: ln,
		srv: &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}}
	go r.srv.Serve(ln)
	return r, nil
}

// Close stops the registry.
func (r *Registry) Close() error { return r.srv.Close() }

// PushDir pushes dir as a one-layer linux/amd64 image named repo:tag on r and
// returns the full reference. env is the image config's environment.
func (r *Registry) PushDir(ctx context.Context, dir, repoTag string, env []string) (string, error) {
	return r.PushDirConfig(ctx, dir, repoTag, v1.Config{Env: env})
}

// PushDirConfig is PushDir with a whole image config (entrypoint, ...).
func (r *Registry) PushDirConfig(ctx context.Context, dir, repoTag string, config v1.Config) (string, error) {
	img, err := dirImage(dir, config)
	if err != nil {
		return "", err
	}
	ref := r.Host + "/" + repoTag
	nr, err := name.ParseReference(ref)
	if err != nil {
		return "", err
	}
	if err := remote.Write(nr, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref, nil
}

// dirImage is dir as a one-layer linux/amd64 image with config.
func dirImage(dir string, config v1.Config) (v1.Image, error) {
	data, err := TarDir(dir)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = config
	return mutate.ConfigFile(img, cf)
}

// WriteImageTarball writes dir as a one-layer linux/amd64 image named ref
// with config to a docker-archive tarball at path (what `docker save`
// writes and `ctr images import` reads).
func WriteImageTarball(dir, ref string, config v1.Config, path string) error {
	img, err := dirImage(dir, config)
	if err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(path, tag, img)
}

// TarDir returns an uncompressed tar of dir's tree (ownership, modes and
// symlinks kept, sockets skipped), with paths relative to dir.
func TarDir(dir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode()&(fs.ModeSocket|fs.ModeNamedPipe) != 0 {
			return nil
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
