package execd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/code"
	"github.com/moat-sandbox/moat/internal/execd/proc"
)

func benchServer(b *testing.B) *httptest.Server {
	b.Helper()
	srv, err := NewServer(Options{BaseEnv: proc.ChildEnv(os.Environ()), StateDir: b.TempDir(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	b.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Close(ctx)
	})
	return ts
}

func benchRun(b *testing.B, ts *httptest.Server, body string) int64 {
	resp, err := ts.Client().Post(ts.URL+"/command", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		b.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return n
}

// BenchmarkExecRoundTrip measures one foreground `true` over HTTP + SSE,
// from request to the end of the stream.
func BenchmarkExecRoundTrip(b *testing.B) {
	ts := benchServer(b)
	for b.Loop() {
		benchRun(b, ts, `{"command":"true"}`)
	}
}

// BenchmarkStreamThroughput streams 32 MiB of 64-byte lines through one
// command (`yes`, so that the generator costs little); b.SetBytes reports
// the stdout stream rate (process output bytes per second).
func BenchmarkStreamThroughput(b *testing.B) {
	ts := benchServer(b)
	const size = 32 << 20
	b.SetBytes(size)
	cmd := `{"command":"yes ` + strings.Repeat("a", 63) + ` | head -c 33554432"}`
	for b.Loop() {
		benchRun(b, ts, cmd)
	}
}

// BenchmarkForkExecBare is the baseline for BenchmarkExecRoundTrip: the
// same `bash -c true` started and waited for directly, without HTTP. The
// agent's exec overhead is the difference of the two.
func BenchmarkForkExecBare(b *testing.B) {
	shell, err := exec.LookPath("bash")
	if err != nil {
		b.Fatal(err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		b.Fatal(err)
	}
	defer devnull.Close()
	for b.Loop() {
		p, err := os.StartProcess(shell, []string{shell, "-c", "true"}, &os.ProcAttr{
			Env: os.Environ(), Files: []*os.File{devnull, devnull, devnull},
			Sys: &syscall.SysProcAttr{Setpgid: true},
		})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}

const benchFileSize = 64 << 20

// BenchmarkUpload uploads one 64 MiB file per iteration through POST
// /files/upload (multipart, metadata first, as the SDKs send it);
// b.SetBytes reports MB/s.
func BenchmarkUpload(b *testing.B) {
	ts := benchServer(b)
	dst := filepath.Join(b.TempDir(), "up.bin")
	data := make([]byte, benchFileSize)
	rand.Read(data)
	meta, _ := json.Marshal(map[string]any{"path": dst, "mode": 644})
	b.SetBytes(benchFileSize)
	for b.Loop() {
		pr, pw := io.Pipe()
		mw := multipart.NewWriter(pw)
		go func() {
			w, _ := mw.CreateFormFile("metadata", "metadata")
			w.Write(meta)
			w, _ = mw.CreateFormFile("file", "up.bin")
			w.Write(data)
			pw.CloseWithError(mw.Close())
		}()
		resp, err := ts.Client().Post(ts.URL+"/files/upload", mw.FormDataContentType(), pr)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("upload: %d", resp.StatusCode)
		}
	}
	if fi, err := os.Stat(dst); err != nil || fi.Size() != benchFileSize {
		b.Fatalf("uploaded file: %v %v", fi, err)
	}
}

// BenchmarkDownload downloads one 64 MiB file per iteration through GET
// /files/download ("agent") and, for comparison on the same machine at the
// same time, through a plain handler that copies the file with a buffered
// read/write loop ("copyloop"); b.SetBytes reports MB/s. The agent must be
// at least as fast as the loop (issue 17).
func BenchmarkDownload(b *testing.B) {
	src := filepath.Join(b.TempDir(), "down.bin")
	data := make([]byte, benchFileSize)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	get := func(b *testing.B, ts *httptest.Server, target string) {
		b.SetBytes(benchFileSize)
		// The client reads 256 KiB at a time (as curl does), so that the
		// server side, not io.Discard's 8 KiB reads, sets the pace.
		buf := make([]byte, 256<<10)
		cpu0 := cpuTime()
		for b.Loop() {
			resp, err := ts.Client().Get(ts.URL + target)
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.CopyBuffer(struct{ io.Writer }{io.Discard}, resp.Body, buf)
			resp.Body.Close()
			if resp.StatusCode != 200 || n != benchFileSize {
				b.Fatalf("download: %d, %d bytes", resp.StatusCode, n)
			}
		}
		// CPU time (server and client, both in this process) is the
		// figure that a loaded machine does not blur.
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/1e6, "cpu-ms/op")
	}
	b.Run("agent", func(b *testing.B) {
		get(b, benchServer(b), "/files/download?path="+url.QueryEscape(src))
	})
	b.Run("copyloop", func(b *testing.B) {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f, err := os.Open(src)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			defer f.Close()
			fi, _ := f.Stat()
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
			buf := make([]byte, 32<<10)
			for {
				n, err := f.Read(buf)
				if n > 0 {
					if _, werr := w.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}))
		b.Cleanup(ts.Close)
		get(b, ts, "/")
	})
}

// BenchmarkCodeRoundTrip runs one python cell (`1`, which has a value) per
// iteration in a code context, with the built-in driver and, when the host
// has one, a real ipykernel.
func BenchmarkCodeRoundTrip(b *testing.B) {
	for _, kernel := range []bool{false, true} {
		b.Run(map[bool]string{false: "builtin", true: "ipykernel"}[kernel], func(b *testing.B) {
			if kernel && code.FindKernelSpec(code.KernelDirs(os.Environ()), "python", os.Environ()) == nil {
				b.Skip("no Jupyter python kernel")
			}
			srv, err := NewServer(Options{BaseEnv: proc.ChildEnv(os.Environ()), StateDir: b.TempDir(), NoKernels: !kernel,
				Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			ts := httptest.NewServer(srv)
			defer func() {
				ts.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				srv.Close(ctx)
			}()
			resp, err := ts.Client().Post(ts.URL+"/code/context", "application/json", bytes.NewReader([]byte(`{"language":"python"}`)))
			if err != nil {
				b.Fatal(err)
			}
			var info code.ContextInfo
			json.NewDecoder(resp.Body).Decode(&info)
			resp.Body.Close()
			body := []byte(`{"context":{"id":"` + info.ID + `"},"code":"1"}`)
			for b.Loop() {
				resp, err := ts.Client().Post(ts.URL+"/code", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !bytes.Contains(data, []byte(`"type":"execution_complete"`)) {
					b.Fatalf("cell: %s", data)
				}
			}
		})
	}
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
