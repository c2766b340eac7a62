package network

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// waitSpares waits until m has n spares ready and returns their
// attachments (as made: no ID, the spare's own veth name).
func waitSpares(t testing.TB, m *Manager, n int) []Attachment {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m.mu.Lock()
		var atts []Attachment
		for _, s := range m.spares {
			atts = append(atts, s.att)
		}
		m.mu.Unlock()
		if len(atts) == n {
			return atts
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares ready after 20 s, want %d", len(atts), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSpares: networks made ahead hold an address but leave nothing on
// disk, sit on the bridge down, and become a sandbox's in Setup (renamed,
// up, reachable); the pool refills; Close removes the spares at once and
// leaves sandboxes alone; what a crash leaves of spares (open handles
// closed, nothing removed) is gone by the kernel's hand and Open's sweep.
func TestSpares(t *testing.T) {
	cfg := testConfig(t, 24)
	cfg.Spares = 2
	m := openTest(t, cfg)
	ctx := context.Background()
	ready := waitSpares(t, m, 2)
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	spareIPs := map[netip.Addr]bool{}
	for _, s := range ready {
		spareIPs[s.IP] = true
		l, err := netlink.LinkByName(s.HostVeth)
		if err != nil {
			t.Fatalf("spare veth %s: %v", s.HostVeth, err)
		}
		if l.Attrs().MasterIndex != br.Attrs().Index || l.Attrs().Flags&net.FlagUp != 0 {
			t.Errorf("spare veth %s: want a port of %s that is down, got master %d flags %v",
				s.HostVeth, cfg.Bridge, l.Attrs().MasterIndex, l.Attrs().Flags)
		}
	}
	for _, dir := range []string{m.ipDir(), cfg.NetnsDir, m.attachDir()} {
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("spares left %d files in %s", len(ents), dir)
		}
	}

	a, err := m.Setup(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !spareIPs[a.IP] {
		t.Errorf("Setup made a new network (%s), want one of the spares %v", a.IP, spareIPs)
	}
	reachable(t, a)
	waitSpares(t, m, 2)

	if _, err := m.Setup(ctx, "s1"); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Setup(s1) = %v, want ErrAlreadyExists", err)
	}
	ready = waitSpares(t, m, 2)

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range ready {
		if _, err := netlink.LinkByName(s.HostVeth); err == nil {
			t.Errorf("spare veth %s outlived Close", s.HostVeth)
		}
		m.mu.Lock()
		owner, held := m.byIP[s.IP]
		m.mu.Unlock()
		if held {
			t.Errorf("address %s of a spare still held (by %q) after Close", s.IP, owner)
		}
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	reachable(t, a) // the sandbox keeps its network
	if err := m.Teardown(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, m, "s1")
}

// TestSparesCrash: a process that dies with spares ready leaves no veth
// (its handles close and the kernel destroys the namespaces and both veth
// ends) and no address; the next Open sweeps their neighbor entries.
func TestSparesCrash(t *testing.T) {
	cfg := testConfig(t, 24)
	cfg.Spares = 3
	m := openTest(t, cfg)
	ready := waitSpares(t, m, 3)
	// The crash: the filler stops, the handles close, nothing is removed.
	close(m.stop)
	<-m.fillDone
	m.mu.Lock()
	for _, s := range m.spares {
		s.ns.Close()
	}
	m.spares, m.closed = nil, true
	m.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range ready {
		for {
			if _, err := netlink.LinkByName(s.HostVeth); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("veth %s of a spare whose namespace handle closed still exists", s.HostVeth)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	reopen := cfg
	reopen.Spares = 0
	if _, err := Open(context.Background(), reopen, nil); err != nil {
		t.Fatal(err)
	}
	left := permanentEntries(t, netlink.NeighList, br.Attrs().Index)
	for _, s := range ready {
		if mac, ok := left[s.IP]; ok {
			t.Errorf("neighbor entry of spare address %s (-> %s) survived Open", s.IP, mac)
		}
	}
}

// reachable checks that the host reaches a TCP listener in a's namespace.
func reachable(t *testing.T, a Attachment) {
	t.Helper()
	l := listenIn(t, a.NetnsPath, netip.AddrPortFrom(a.IP, 0).String())
	defer l.Close()
	go serveHi(l)
	c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("host -> sandbox %s: %v", a.ID, err)
	}
	c.Close()
}

// TestTeardownDeletesLater: Teardown returns before the kernel has deleted
// the veth; a Setup of the same ID right after waits for that deletion
// (the veth name is the same) and works, and Close waits for every
// deletion.
func TestTeardownDeletesLater(t *testing.T) {
	withSpares(t, func(t *testing.T, spares int) {
		cfg := testConfig(t, 24)
		cfg.Spares = spares
		m := openTest(t, cfg)
		ctx := context.Background()
		for i := range 5 {
			if _, err := m.Setup(ctx, "again"); err != nil {
				t.Fatalf("Setup %d right after Teardown: %v", i, err)
			}
			if i == 4 {
				break
			}
			if err := m.Teardown(ctx, "again"); err != nil {
				t.Fatal(err)
			}
		}
		a, err := m.Get(ctx, "again")
		if err != nil {
			t.Fatal(err)
		}
		reachable(t, a)
		var names []string
		for i := range 8 {
			id := "later-" + string(rune('a'+i))
			if _, err := m.Setup(ctx, id); err != nil {
				t.Fatal(err)
			}
			names = append(names, HostVethName(id))
		}
		for i := range 8 {
			if err := m.Teardown(ctx, "later-"+string(rune('a'+i))); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if _, err := netlink.LinkByName(name); err == nil {
				t.Errorf("veth %s of a torn-down sandbox outlived Close", name)
			}
		}
	})
}
