package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/localregistry"
)

func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	root := NewRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	code := 0
	if err := root.ExecuteContext(context.Background()); err != nil {
		code = ExitCode(err)
		errOut.WriteString(err.Error())
	}
	return out.String(), errOut.String(), code
}

func TestImageCommands(t *testing.T) {
	ctx := context.Background()
	reg, err := localregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	rootfs := testutil.BusyboxRootfs(t)
	ref, err := reg.PushDir(ctx, rootfs, "cli/busybox:1", []string{"A=1"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()

	out, errOut, code := runCLI(t, "image", "pull", "--root", dir, ref)
	if code != 0 || !strings.HasPrefix(out, ref+" sha256:") || !strings.Contains(errOut, "done") {
		t.Fatalf("pull: code %d out %q err %q", code, out, errOut)
	}
	if out, errOut, code = runCLI(t, "image", "import", "--root", dir, "local/bb", rootfs); code != 0 {
		t.Fatalf("import: code %d out %q err %q", code, out, errOut)
	}
	out, _, code = runCLI(t, "image", "ls", "--root", dir)
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, ref) || !strings.Contains(out, "index.docker.io/local/bb:latest") {
		t.Fatalf("ls: code %d out %q", code, out)
	}
	out, _, code = runCLI(t, "image", "ls", "--root", dir, "-o", "json")
	var imgs []image.Image
	if code != 0 || json.Unmarshal([]byte(out), &imgs) != nil || len(imgs) != 2 {
		t.Fatalf("ls -o json: code %d out %q", code, out)
	}
	if _, _, code = runCLI(t, "image", "rm", "--root", dir, ref, "local/bb"); code != 0 {
		t.Fatalf("rm: code %d", code)
	}
	if _, _, code = runCLI(t, "image", "rm", "--root", dir, ref); code != 4 {
		t.Fatalf("rm missing: exit %d, want 4 (not found)", code)
	}
	if _, _, code = runCLI(t, "image", "pull", "--root", dir, "Bad::Ref"); code != 2 {
		t.Fatalf("pull bad ref: exit %d, want 2", code)
	}
}
