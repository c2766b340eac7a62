package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// SysctlRoot is where the kernel's sysctls are (EnableForwarding6's root).
const SysctlRoot = "/proc/sys"

// EnableForwarding6 makes the host route IPv6 packets that arrive on
// iface. Linux 6.17+ can do it for that interface alone
// (net.ipv6.conf.<iface>.force_forwarding). Older kernels have only the
// global switch, net.ipv6.conf.all.forwarding, which EnableForwarding6
// then turns on, reporting fallback so the caller warns: every interface
// forwards, and ones with accept_ra=1 stop taking router advertisements.
// root is the sysctl tree (SysctlRoot; tests pass one of their own).
func EnableForwarding6(root, iface string) (fallback bool, err error) {
	conf := filepath.Join(root, "net/ipv6/conf")
	if _, err := os.Stat(filepath.Join(conf, iface)); err != nil {
		return false, fmt.Errorf("network: IPv6 forwarding on %s: %w", iface, err)
	}
	force := filepath.Join(conf, iface, "force_forwarding")
	if _, err := os.Stat(force); err == nil {
		return false, writeSysctl(force, "1")
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("network: IPv6 forwarding on %s: %w", iface, err)
	}
	return true, writeSysctl(filepath.Join(conf, "all", "forwarding"), "1")
}
