package image

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// BenchmarkImportDir measures rootfs directory import (archive + hash +
// extract) of the busybox rootfs.
func BenchmarkImportDir(b *testing.B) {
	ctx := context.Background()
	src := testutil.BusyboxRootfs(b)
	s := openStore(b)
	img, err := s.Import(ctx, "bench", src)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(img.Size)
	b.ResetTimer()
	for range b.N {
		if _, err := s.Import(ctx, "bench", src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExtract measures layer extraction of a 64 MiB tar of 1024
// files in 32 directories.
func BenchmarkExtract(b *testing.B) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	var entries []entry
	body := make([]byte, 64<<10)
	for d := range 32 {
		entries = append(entries, entry{name: fmt.Sprintf("d%d/", d), typ: '5'})
		for f := range 32 {
			for i := range body {
				body[i] = byte(r.Uint32())
			}
			entries = append(entries, entry{name: fmt.Sprintf("d%d/f%d", d, f), body: string(body)})
		}
	}
	data := mkTar(b, entries...)
	s := openStore(b)
	unlock, err := s.writerLock()
	if err != nil {
		b.Fatal(err)
	}
	defer unlock()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		if _, _, err := s.putLayer(ctx, bytes.NewReader(data), ""); err != nil {
			b.Fatal(err)
		}
	}
}
