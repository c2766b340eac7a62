package network

import (
	"context"
	"errors"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Deleting host veths after Teardown returns.
//
// Deleting a veth (both ends go together) is the slow part of a teardown:
// the kernel unregisters the devices under the rtnl lock and waits for an
// RCU grace period, ≈ 10-30 ms on a busy host, where everything else
// Teardown does takes well under a millisecond. Teardown hands the host end
// to one deleter goroutine (started when needed, gone when the queue is
// empty) and returns. What may follow safely before the deletion is done:
// the sandbox's address goes back to the pool at once; the veth's port is
// isolated on the bridge, the host's permanent neighbor entry for the
// address was removed, and a new owner of the address gets its own
// permanent entry to its own MAC, so no frame for the new owner reaches the
// old port. A Setup of the same sandbox ID (whose veth name is the same)
// waits for the deletion; Close waits for all of them. A crash meanwhile
// leaves the veth without its namespace file: the kernel destroys it with
// the namespace, and Open deletes any such port left on the bridge.

// deleteLater queues the deletion of host veth link.
func (m *Manager) deleteLater(link netlink.Link) {
	name := link.Attrs().Name
	m.delMu.Lock()
	defer m.delMu.Unlock()
	if _, queued := m.deleting[name]; queued {
		return
	}
	m.deleting[name] = make(chan struct{})
	m.delQueue = append(m.delQueue, link)
	if !m.delRunning {
		m.delRunning = true
		go m.deleter()
	}
}

// deleter deletes the queued veths, one at a time (each takes the rtnl
// lock anyway), and exits when the queue is empty.
func (m *Manager) deleter() {
	for {
		m.delMu.Lock()
		if len(m.delQueue) == 0 {
			m.delRunning = false
			m.delMu.Unlock()
			return
		}
		link := m.delQueue[0]
		m.delQueue = m.delQueue[1:]
		m.delMu.Unlock()
		if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			m.log.Warn("network: delete veth", "name", link.Attrs().Name, "err", err)
		}
		m.delMu.Lock()
		close(m.deleting[link.Attrs().Name])
		delete(m.deleting, link.Attrs().Name)
		m.delMu.Unlock()
	}
}

// awaitDeleted waits until host veth name is not being deleted.
func (m *Manager) awaitDeleted(ctx context.Context, name string) error {
	m.delMu.Lock()
	done, ok := m.deleting[name]
	m.delMu.Unlock()
	if !ok {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settleDeletes waits until no veth is being deleted.
func (m *Manager) settleDeletes() {
	for {
		var done chan struct{}
		m.delMu.Lock()
		for _, ch := range m.deleting {
			done = ch
			break
		}
		m.delMu.Unlock()
		if done == nil {
			return
		}
		<-done
	}
}
