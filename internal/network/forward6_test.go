package network

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sysctlTree makes a fake sysctl root with net.ipv6.conf.{all,iface} and,
// if force, iface's force_forwarding (the kernel has it from 6.17).
func sysctlTree(t *testing.T, iface string, force bool) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []string{"all/forwarding", iface + "/forwarding"} {
		p := filepath.Join(root, "net/ipv6/conf", f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("0\n"), 0o644)
	}
	if force {
		os.WriteFile(filepath.Join(root, "net/ipv6/conf", iface, "force_forwarding"), []byte("0\n"), 0o644)
	}
	return root
}

func readSysctlFile(t *testing.T, root, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "net/ipv6/conf", key))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestEnableForwarding6 checks both kernels: with force_forwarding only
// the interface forwards; without it (before Linux 6.17) the global switch
// is turned on and the fallback reported, instead of failing.
func TestEnableForwarding6(t *testing.T) {
	root := sysctlTree(t, "br0", true)
	fallback, err := EnableForwarding6(root, "br0")
	if err != nil || fallback {
		t.Fatalf("with force_forwarding: fallback %v, err %v", fallback, err)
	}
	if got := readSysctlFile(t, root, "br0/force_forwarding"); got != "1" {
		t.Errorf("br0 force_forwarding = %s, want 1", got)
	}
	if got := readSysctlFile(t, root, "all/forwarding"); got != "0" {
		t.Errorf("all.forwarding = %s, want it untouched (0)", got)
	}

	root = sysctlTree(t, "br0", false)
	fallback, err = EnableForwarding6(root, "br0")
	if err != nil || !fallback {
		t.Fatalf("without force_forwarding: fallback %v, err %v; want the fallback", fallback, err)
	}
	if got := readSysctlFile(t, root, "all/forwarding"); got != "1" {
		t.Errorf("all.forwarding = %s, want 1", got)
	}

	if _, err := EnableForwarding6(root, "nosuch0"); err == nil {
		t.Errorf("an interface the kernel does not have: no error")
	}
}
