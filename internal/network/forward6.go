package network

import (
	"errors"
	"fmt"
	"log/slog"
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

// Forward6 is EnableForwarding6 on the host's sysctls, with the warning
// that the fallback deserves; every bridge that carries sandbox IPv6 (the
// native one, the Docker network's) is set up through it.
func Forward6(log *slog.Logger, iface string) error {
	fallback, err := EnableForwarding6(SysctlRoot, iface)
	if err == nil && fallback {
		log.Warn("network: this kernel cannot forward IPv6 for one interface only (force_forwarding, Linux 6.17+); "+
			"turned on net.ipv6.conf.all.forwarding: every interface now forwards IPv6, and those with accept_ra=1 ignore router advertisements",
			"bridge", iface)
	}
	return err
}
