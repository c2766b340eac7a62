package dnsproxy

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// maxUpstreams caps the nameservers taken from resolv.conf (as OpenSandbox).
const maxUpstreams = 10

// UpstreamsFromResolvConf returns the nameservers of a resolv.conf file
// (normally the host's /etc/resolv.conf) as "ip:53" upstreams, in order.
// Loopback resolvers (e.g. systemd-resolved's 127.0.0.53) are fine: the
// proxy forwards from the host namespace. It fails with ErrNotFound if the
// file lists none.
func UpstreamsFromResolvConf(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dnsproxy: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() && len(out) < maxUpstreams {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil || a.Zone() != "" {
			continue // zoned link-local resolvers cannot be dialled portably
		}
		out = append(out, net.JoinHostPort(a.Unmap().String(), "53"))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("dnsproxy: read %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("dnsproxy: no nameserver in %s: %w", path, errdefs.ErrNotFound)
	}
	return out, nil
}
