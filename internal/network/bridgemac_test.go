package network

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

func bridgeMAC(t *testing.T, name string) string {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().HardwareAddr.String()
}

// TestBridgeMACStable guards against the gateway MAC following the bridge's
// ports: Linux gives an unpinned bridge the lowest MAC of its ports, so it
// changed with every sandbox created or deleted, and sandboxes that had
// resolved the gateway earlier lost their replies to the host until their
// ARP entry expired (first commands stalled for seconds to minutes under
// `moat bench load`).
func TestBridgeMACStable(t *testing.T) {
	m := openTest(t, testConfig(t, 24))
	ctx := context.Background()
	br := m.Bridge()
	want := bridgeMAC(t, br)
	if want == "00:00:00:00:00:00" || want == "" {
		t.Fatalf("bridge MAC after Open = %q", want)
	}
	typ, err := os.ReadFile(filepath.Join("/sys/class/net", br, "addr_assign_type"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(typ)); got != "3" {
		t.Errorf("bridge addr_assign_type = %s, want 3 (NET_ADDR_SET)", got)
	}
	for i := range 4 {
		id := fmt.Sprintf("mac-%d", i)
		if _, err := m.Setup(ctx, id); err != nil {
			t.Fatal(err)
		}
		if got := bridgeMAC(t, br); got != want {
			t.Fatalf("bridge MAC after Setup(%s) = %s, want %s", id, got, want)
		}
		if i%2 == 1 {
			if err := m.Teardown(ctx, id); err != nil {
				t.Fatal(err)
			}
			if got := bridgeMAC(t, br); got != want {
				t.Fatalf("bridge MAC after Teardown(%s) = %s, want %s", id, got, want)
			}
		}
	}
	// A restart keeps the address, so running sandboxes keep their gateway.
	if err := m.ensureBridge(); err != nil {
		t.Fatal(err)
	}
	if got := bridgeMAC(t, br); got != want {
		t.Fatalf("bridge MAC after ensureBridge again = %s, want %s", got, want)
	}
}

// TestSetupForgetsStaleNeighbor: an address handed out again must not keep
// the host's neighbor entry of its previous owner (a MAC that is gone), or
// the host's first packets to the new sandbox are lost until it expires.
func TestSetupForgetsStaleNeighbor(t *testing.T) {
	m := openTest(t, testConfig(t, 24))
	ctx := context.Background()
	a, err := m.Setup(ctx, "neigh-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, "neigh-0"); err != nil {
		t.Fatal(err)
	}
	br, err := netlink.LinkByName(m.Bridge())
	if err != nil {
		t.Fatal(err)
	}
	// Plant a stale entry on every address the next Setup might get.
	stale, _ := net.ParseMAC("02:00:5e:00:53:01")
	ip := a.IP
	for range 16 {
		n := &netlink.Neigh{LinkIndex: br.Attrs().Index, IP: net.IP(ip.AsSlice()), HardwareAddr: stale,
			State: netlink.NUD_REACHABLE, Family: netlink.FAMILY_V4}
		if err := netlink.NeighSet(n); err != nil {
			t.Fatal(err)
		}
		ip = ip.Next()
	}
	b, err := m.Setup(ctx, "neigh-1")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Teardown(ctx, "neigh-1")
	a.IP = b.IP
	list, err := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if e.IP.Equal(net.IP(a.IP.AsSlice())) && e.HardwareAddr.String() == stale.String() {
			t.Fatalf("stale neighbor entry for %s survived Setup: %+v", a.IP, e)
		}
	}
}
