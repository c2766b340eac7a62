package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Spares: attachments made ahead of Setup (Config.Spares).
//
// A spare is a complete sandbox network without an owner: a namespace held
// only by an open handle of this process (no file), its veth pair with the
// host end on the bridge but down, an address reserved in memory (no file)
// and configured on eth0 with its routes and static neighbor entries. Setup
// gives one to a sandbox with a few cheap steps: the address file, a bind
// mount of the namespace at the sandbox's path, the host end renamed to the
// sandbox's name and brought up, and the attachment record. What a crash
// leaves of a spare frees itself: the handle closes, the kernel destroys
// the namespace and with it both veth ends; the address was never on
// disk; its neighbor entry on the bridge goes at the next Open
// (sweepNeighbors).

// spare is one attachment made ahead.
type spare struct {
	ns   netns.NsHandle
	host int // interface index of the host end (a random name until claimed)
	att  Attachment
}

// spareRetry is how long the filler waits after failing to make a spare.
const spareRetry = time.Second

// fill keeps Config.Spares spares ready until Close.
func (m *Manager) fill() {
	defer close(m.fillDone)
	for {
		for m.wantSpare() {
			s, err := m.makeSpare()
			m.mu.Lock()
			if err == nil {
				m.spares = append(m.spares, s)
			}
			m.making = false
			close(m.ready) // wakes awaitSpare
			m.ready = make(chan struct{})
			m.mu.Unlock()
			if errors.Is(err, errdefs.ErrResourceExhausted) {
				break // until a Teardown frees an address
			}
			if err != nil {
				m.log.Warn("network: making a spare attachment failed", "err", err)
				select {
				case <-m.stop:
					return
				case <-time.After(spareRetry):
				}
			}
		}
		select {
		case <-m.stop:
			return
		case <-m.kick:
		}
	}
}

// wantSpare reports whether the filler should make another spare.
func (m *Manager) wantSpare() bool {
	select {
	case <-m.stop:
		return false
	default:
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.making = len(m.spares) < m.cfg.Spares
	return m.making
}

// awaitSpare waits for the spare the filler is making, if it is making
// one, and takes it: the filler may hold the last free address (Setup
// found none).
func (m *Manager) awaitSpare(ctx context.Context) *spare {
	m.mu.Lock()
	making, ready := m.making, m.ready
	m.mu.Unlock()
	if !making {
		return nil
	}
	select {
	case <-ready:
		return m.takeSpare()
	case <-ctx.Done():
		return nil
	}
}

// makeSpare makes one spare; on error nothing is left behind.
func (m *Manager) makeSpare() (_ *spare, err error) {
	m.mu.Lock()
	ip, err := m.reserveLocked()
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var name [6]byte
	rand.Read(name[:])
	s := &spare{att: m.attachment(ip, hostVethPrefix+hex.EncodeToString(name[:]))}
	if s.ns, err = newNetns(); err != nil {
		m.unreserve(ip)
		return nil, err
	}
	if s.host, err = m.plumb(s.att, s.ns); err != nil {
		m.discard(s)
		return nil, err
	}
	return s, nil
}

// kickFiller asks the filler to check the pool.
func (m *Manager) kickFiller() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// takeSpare removes a ready spare from the pool, if there is one. The
// caller kicks the filler once done with it (a refill meanwhile would hold
// the rtnl lock the claim needs).
func (m *Manager) takeSpare() *spare {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.spares)
	if n == 0 || m.closed {
		return nil
	}
	s := m.spares[n-1]
	m.spares = m.spares[:n-1]
	return s
}

// claim gives spare s to sandbox id (see Setup). On error the sandbox has
// no network and the spare is gone.
func (m *Manager) claim(ctx context.Context, id string, s *spare) (_ Attachment, err error) {
	defer m.kickFiller()
	a := s.att
	a.ID, a.NetnsPath, a.HostVeth = id, m.NetnsPath(id), HostVethName(id)
	m.mu.Lock()
	if _, ok := m.byID[id]; ok {
		m.mu.Unlock()
		m.discard(s)
		return Attachment{}, fmt.Errorf("network: sandbox %s: %w", id, errdefs.ErrAlreadyExists)
	}
	err = m.recordLocked(id, a.IP)
	m.mu.Unlock()
	if err != nil {
		m.discard(s)
		return Attachment{}, err
	}
	defer func() {
		// The handle goes in any case: on success the bind mount holds the
		// namespace; on error Teardown removed it, and closing the handle
		// destroys the namespace with a veth not yet renamed.
		s.ns.Close()
		if err != nil {
			if terr := m.Teardown(context.WithoutCancel(ctx), id); terr != nil {
				m.log.Warn("network: rollback failed", "id", id, "err", terr)
			}
		}
	}()
	if err := bindNetns(s.ns, a.NetnsPath); err != nil {
		return Attachment{}, err
	}
	host := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: s.host}}
	if err := netlink.LinkSetName(host, a.HostVeth); err != nil {
		return Attachment{}, fmt.Errorf("network: rename spare veth %s to %s: %w", s.att.HostVeth, a.HostVeth, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return Attachment{}, fmt.Errorf("network: bring up %s: %w", a.HostVeth, err)
	}
	if err := writeJSONAtomic(filepath.Join(m.attachDir(), id+".json"), a); err != nil {
		return Attachment{}, fmt.Errorf("network: record attachment: %w", err)
	}
	return a, nil
}

// discard removes a spare that no sandbox got: its veth pair (at once, so
// nothing is seen left on the bridge), its namespace, its neighbor entries
// and its address.
func (m *Manager) discard(s *spare) {
	if s.host != 0 {
		if err := netlink.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: s.host}}); err != nil {
			m.log.Debug("network: delete spare veth", "name", s.att.HostVeth, "err", err)
		}
	}
	s.ns.Close()
	m.forgetNeighbors(s.att.IP, s.att.IP6)
	m.unreserve(s.att.IP)
}

// unreserve frees an address reserved for a spare.
func (m *Manager) unreserve(ip netip.Addr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byIP[ip] == spareOwner {
		delete(m.byIP, ip)
	}
}

// Close stops making spares, removes the ready ones and waits for the
// veths of torn-down sandboxes to be deleted. Attachments of sandboxes
// stay. It is idempotent.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	if m.stop != nil {
		close(m.stop)
		<-m.fillDone
	}
	m.mu.Lock()
	spares := m.spares
	m.spares = nil
	m.mu.Unlock()
	for _, s := range spares {
		m.discard(s)
	}
	m.settleDeletes()
	return nil
}
