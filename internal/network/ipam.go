package network

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// IPAM: crash-safe address allocation, one O_EXCL file per address under
// StateDir/ips, next-fit from a cursor.

// ip6For maps an IPv4 sandbox address to its IPv6 one: the same offset
// from the start of Subnet6 as ip has from the start of Subnet.
func (m *Manager) ip6For(ip netip.Addr) netip.Addr {
	if !m.cfg.Subnet6.IsValid() {
		return netip.Addr{}
	}
	a, b := ip.As4(), m.cfg.Subnet.Addr().As4()
	off := (uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])) -
		(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))
	v := m.cfg.Subnet6.Addr().As16()
	for i := 15; i >= 12; i-- {
		v[i] |= byte(off)
		off >>= 8
	}
	return netip.AddrFrom16(v)
}

// spareOwner holds the addresses of spares in byIP: it is no sandbox ID
// (idPattern refuses it) and has no file, so a crash frees them.
const spareOwner = " spare"

// allocate reserves a free address for id. The address file is created
// with O_EXCL before it is used, so a crash never hands one address out
// twice; reconcile frees files that belong to no complete attachment.
func (m *Manager) allocate(id string) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byID[id]; ok {
		return netip.Addr{}, fmt.Errorf("network: sandbox %s: %w", id, errdefs.ErrAlreadyExists)
	}
	for {
		ip, err := m.reserveLocked()
		if err != nil {
			return netip.Addr{}, err
		}
		err = m.recordLocked(id, ip)
		if errors.Is(err, os.ErrExist) {
			continue // a file this process did not know of: leave it alone
		}
		if err != nil {
			delete(m.byIP, ip)
			return netip.Addr{}, err
		}
		return ip, nil
	}
}

// reserveLocked takes the next free address, next-fit from the cursor, in
// memory only (for spareOwner until recordLocked gives it to a sandbox).
// Precondition: m.mu is held.
func (m *Manager) reserveLocked() (netip.Addr, error) {
	first := m.gateway.Next()
	last := lastHost(m.cfg.Subnet)
	ip := m.cursor
	for range numHosts(m.cfg.Subnet) {
		ip = ip.Next()
		if !m.cfg.Subnet.Contains(ip) || ip.Compare(last) > 0 || ip.Compare(first) < 0 {
			ip = first
		}
		if _, used := m.byIP[ip]; used {
			continue
		}
		m.byIP[ip] = spareOwner
		m.cursor = ip
		return ip, nil
	}
	return netip.Addr{}, fmt.Errorf("network: no free address in %s: %w", m.cfg.Subnet, errdefs.ErrResourceExhausted)
}

// recordLocked gives the reserved address ip to id, on disk (an O_EXCL
// file holding the ID: os.ErrExist if one is there) and in memory.
// Precondition: m.mu is held.
func (m *Manager) recordLocked(id string, ip netip.Addr) error {
	f, err := os.OpenFile(filepath.Join(m.ipDir(), ip.String()), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return err // stays reserved: the address is taken
	}
	if err != nil {
		return fmt.Errorf("network: allocate: %w", err)
	}
	_, werr := f.WriteString(id)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(f.Name())
		return fmt.Errorf("network: allocate: %w", errors.Join(werr, cerr))
	}
	m.byIP[ip] = id
	m.byID[id] = ip
	return nil
}

// release frees the address of id (in memory and on disk), if any.
func (m *Manager) release(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ip, ok := m.byID[id]
	if ok {
		delete(m.byID, id)
		delete(m.byIP, ip)
		if err := os.Remove(filepath.Join(m.ipDir(), ip.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	// Not known in memory (e.g. Teardown during reconcile): scan the files.
	entries, err := os.ReadDir(m.ipDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(m.ipDir(), e.Name())
		if data, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(data)) == id {
			os.Remove(p)
		}
	}
	return nil
}

// lastHost is the highest usable address of p (the broadcast address is
// excluded).
func lastHost(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	hostBits := 32 - p.Bits()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= (1 << hostBits) - 1
	v-- // broadcast
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// numHosts is the number of allocatable sandbox addresses in p (network,
// gateway and broadcast excluded).
func numHosts(p netip.Prefix) int {
	return 1<<(32-p.Bits()) - 3
}
