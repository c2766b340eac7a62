package docker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// EnsureImage returns the image ref from the daemon, pulling it first
// (with auth, if given) when the daemon does not have it. Name is ref as
// given; ID, Layers and Config come from the daemon's image inspect.
func (r *Runtime) EnsureImage(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	if ref == "" {
		return image.Image{}, runtime.Invalid("image is required")
	}
	res, err := r.cli.ImageInspect(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		if perr := r.pull(ctx, ref, auth); perr != nil {
			return image.Image{}, perr
		}
		res, err = r.cli.ImageInspect(ctx, ref)
	}
	if err != nil {
		return image.Image{}, classify("image "+ref, err)
	}
	img := image.Image{
		Name:   ref,
		ID:     res.ID,
		Layers: res.RootFS.Layers,
		Size:   res.Size,
	}
	if len(res.RepoDigests) > 0 {
		if _, d, ok := strings.Cut(res.RepoDigests[0], "@"); ok {
			img.Digest = d
		}
	}
	if t := res.Metadata.LastTagTime; !t.IsZero() {
		img.CreatedAt = t
	} else if t, err := time.Parse(time.RFC3339Nano, res.Created); err == nil {
		img.CreatedAt = t
	}
	if c := res.Config; c != nil {
		img.Config = image.Config{
			Env: c.Env, Entrypoint: c.Entrypoint, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User,
		}
	}
	return img, nil
}

func (r *Runtime) pull(ctx context.Context, ref string, auth *image.Auth) error {
	opts := client.ImagePullOptions{}
	if auth != nil && (auth.Username != "" || auth.Password != "") {
		data, err := json.Marshal(struct {
			Username string `json:"username,omitempty"`
			Password string `json:"password,omitempty"`
		}{auth.Username, auth.Password})
		if err != nil {
			return err
		}
		opts.RegistryAuth = base64.URLEncoding.EncodeToString(data)
	}
	t0 := time.Now()
	resp, err := r.cli.ImagePull(ctx, ref, opts)
	if err != nil {
		switch {
		case cerrdefs.IsInvalidArgument(err):
			return runtime.Invalid("invalid image reference %q", ref)
		case cerrdefs.IsNotFound(err), cerrdefs.IsUnauthorized(err), cerrdefs.IsPermissionDenied(err), errors.Is(err, context.Canceled):
			return classify("pull "+ref, err)
		}
		// The daemon reports a registry it cannot reach as a 500.
		return fmt.Errorf("docker: pull %s: %w: %w", ref, err, errdefs.ErrUnavailable)
	}
	defer resp.Close()
	for msg, err := range resp.JSONMessages(ctx) {
		if err != nil {
			return classify("pull "+ref, err)
		}
		if msg.Error != nil {
			return pullError(ref, msg.Error.Message)
		}
	}
	r.log.Debug("docker: pulled", "image", ref, "took", time.Since(t0))
	return nil
}

// pullError classifies an error reported in the pull stream, which
// carries only a message.
func pullError(ref, msg string) error {
	m := strings.ToLower(msg)
	var class error
	switch {
	case strings.Contains(m, "not found") || strings.Contains(m, "manifest unknown") || strings.Contains(m, "does not exist"):
		class = errdefs.ErrNotFound
	case strings.Contains(m, "unauthorized") || strings.Contains(m, "authentication required"):
		class = errdefs.ErrUnauthenticated
	case strings.Contains(m, "denied"):
		class = errdefs.ErrPermissionDenied
	default:
		class = errdefs.ErrUnavailable
	}
	return fmt.Errorf("docker: pull %s: %s: %w", ref, msg, class)
}
