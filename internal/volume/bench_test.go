package volume

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// BenchmarkCreateVolume: one 1 GiB named volume (sparse file, mkfs.ext4
// with a journal), then its deletion outside the timer.
func BenchmarkCreateVolume(b *testing.B) {
	testutil.RequiresRoot(b)
	ctx := context.Background()
	s, err := OpenStore(filepath.Join(b.TempDir(), "v"), 0)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("b%d", i)
		if _, err := s.Create(ctx, runtime.VolumeSpec{Name: name}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		s.Delete(ctx, name)
		b.StartTimer()
	}
}

// BenchmarkAcquireRelease: the first user of an idle volume (loop device
// and ext4 mount) and the last user's release (unmount), as a sandbox's
// create and delete pay them.
func BenchmarkAcquireRelease(b *testing.B) {
	testutil.RequiresRoot(b)
	ctx := context.Background()
	s, err := OpenStore(filepath.Join(b.TempDir(), "v"), 0)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Create(ctx, runtime.VolumeSpec{Name: "b"}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := s.Acquire(ctx, "b", "sb"); err != nil {
			b.Fatal(err)
		}
		if err := s.Release("b", "sb"); err != nil {
			b.Fatal(err)
		}
	}
	s.Delete(ctx, "b")
}
