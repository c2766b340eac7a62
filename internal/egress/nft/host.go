package nft

import (
	"context"
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// HostConfig describes the host-side rules for one sandbox bridge.
type HostConfig struct {
	// Bridge is the sandbox bridge interface.
	Bridge string
	// Subnet is the sandbox address range; it is masqueraded on the way out.
	Subnet netip.Prefix
	// Gateway is the bridge address; sandboxes may reach only its DNS port
	// (53, udp and tcp) on the host.
	Gateway netip.Addr
	// Subnet6 is the sandbox IPv6 range (optional). When set it is
	// masqueraded like Subnet. IPv6 forwarding for the bridge is the
	// network package's (network.EnableForwarding6, at bridge set-up).
	Subnet6 netip.Prefix
}

// HostTable is the name of the host table for a bridge (one per bridge, so
// servers on different bridges do not disturb each other).
func HostTable(bridge string) string { return "moat-host-" + bridge }

// ApplyHost installs (atomically replacing) cfg.Bridge's host table, so
// sandboxes reach no host service but DNS on the gateway and the
// connections the intercept table redirected, cannot reach each other, and
// leave masqueraded; IPv6 solicitations get in, router advertisements and
// redirects do not. It enables IPv4 forwarding (IPv6 forwarding for the
// bridge is network.EnableForwarding6's); the per-sandbox policy is
// enforced in each netns (Firewall).
func ApplyHost(ctx context.Context, cfg HostConfig) error {
	if cfg.Bridge == "" || !cfg.Subnet.IsValid() || !cfg.Gateway.Is4() {
		return fmt.Errorf("nft: host rules need a bridge, subnet and IPv4 gateway")
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("nft: enable ip_forward: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nft: netlink: %w", err)
	}
	defer c.CloseLasting()
	addHostTable(c, cfg)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: install host table %s: %w", HostTable(cfg.Bridge), err)
	}
	return nil
}

// addHostTable queues cfg.Bridge's host table on c. It replaces the old
// one atomically: add+delete the old table, then build the new one, all
// in one batch.
func addHostTable(c *nftables.Conn, cfg HostConfig) {
	name := HostTable(cfg.Bridge)
	c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})

	policyAccept := nftables.ChainPolicyAccept
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &policyAccept})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &policyAccept})

	m := hostMatches{
		fromBridge: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(cfg.Bridge)},
		},
		toBridge: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(cfg.Bridge)},
		},
		established: []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: nativeU32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: nativeU32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
		},
	}
	for _, r := range m.inputRules(cfg.Gateway) {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: r})
	}
	for _, r := range m.forwardRules() {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: r})
	}
	for _, sub := range []netip.Prefix{cfg.Subnet, cfg.Subnet6} {
		if !sub.IsValid() {
			continue
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: concat(saddrIn(sub), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(cfg.Bridge)},
			&expr.Masq{},
		})})
	}
}

// hostMatches are the matches the host table's rules share.
type hostMatches struct {
	fromBridge, toBridge, established []expr.Any
}

// inputRules let from the bridge only replies, DNS to the gateway,
// redirected connections and neighbour discovery reach the host.
func (m hostMatches) inputRules(gateway netip.Addr) [][]expr.Any {
	from := m.fromBridge
	return [][]expr.Any{
		concat(from, m.established, []expr.Any{accept()}),
		concat(from, daddrEq(gateway), l4Port(unix.IPPROTO_UDP, 53), []expr.Any{accept()}),
		concat(from, daddrEq(gateway), l4Port(unix.IPPROTO_TCP, 53), []expr.Any{accept()}),
		// Connections the intercept table redirected to the credential proxy.
		concat(from, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: nativeU32(InterceptMark)},
			accept(),
		}),
		concat(from, icmp6Type(133), []expr.Any{accept()}), // router solicitation
		concat(from, icmp6Type(135), []expr.Any{accept()}), // neighbour solicitation
		concat(from, icmp6Type(136), []expr.Any{accept()}), // neighbour advertisement
		concat(from, []expr.Any{&expr.Counter{}, drop()}),
	}
}

// forwardRules let sandbox traffic leave and replies come back, but
// route nothing from the bridge back into it (sandbox to sandbox).
func (m hostMatches) forwardRules() [][]expr.Any {
	return [][]expr.Any{
		concat(m.fromBridge, m.toBridge, []expr.Any{&expr.Counter{}, drop()}),
		concat(m.fromBridge, []expr.Any{accept()}),
		concat(m.toBridge, m.established, []expr.Any{accept()}),
	}
}

// RemoveHost deletes the host table of a bridge (idempotent).
func RemoveHost(ctx context.Context, bridge string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: HostTable(bridge)}
	c.AddTable(t)
	c.DelTable(t)
	return c.Flush()
}

func nativeU32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

// saddrIn matches packets whose source address is in p (the family is
// checked first: the inet table sees both).
func saddrIn(p netip.Prefix) []expr.Any {
	p = p.Masked()
	proto, off, n := byte(unix.NFPROTO_IPV4), uint32(12), uint32(4)
	if p.Addr().Is6() {
		proto, off, n = unix.NFPROTO_IPV6, 8, 16
	}
	mask := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
	}
}

// icmp6Type matches "icmpv6 type t".
func icmp6Type(t byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{t}},
	}
}
