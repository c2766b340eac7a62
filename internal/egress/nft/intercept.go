//go:build linux

package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// InterceptMark is the packet mark the intercept table puts on a
// connection's first packet when it redirects it to the credential proxy;
// the host table (ApplyHost) accepts marked packets from the bridge. A
// sandbox cannot forge it: marks are cleared when a packet leaves its
// network namespace.
const InterceptMark = 0x6d766c74 // "mvlt"

// Intercept set names.
const (
	setClients4 = "clients4"
	setClients6 = "clients6"
)

// InterceptTable is the name of the intercept table of a bridge.
func InterceptTable(bridge string) string { return "moat-vault-" + bridge }

// InterceptConfig describes the redirection of Credential Vault sandboxes'
// HTTP(S) to the credential proxy (package mitm) on the host.
type InterceptConfig struct {
	// Bridge is the sandbox bridge; only packets arriving on it are
	// redirected.
	Bridge string
	// Proxy is where IPv4 clients' connections go (the bridge gateway and
	// the proxy's port).
	Proxy netip.AddrPort
	// Proxy6 is where IPv6 clients' connections go (optional).
	Proxy6 netip.AddrPort
	// Ports are the TCP destination ports redirected. Default 80 and 443.
	Ports []uint16
}

// ApplyIntercept installs (atomically replacing) the intercept table of
// cfg.Bridge: TCP to Ports from the addresses in its client sets (empty
// at first, see AddInterceptClient) is marked and DNATed to the proxy.
// It runs on the host, after the sandbox's own egress rules, so what it
// redirects is a connection the policy allowed anyway, on any runtime.
func ApplyIntercept(ctx context.Context, cfg InterceptConfig) error {
	if cfg.Bridge == "" || !cfg.Proxy.Addr().Is4() || cfg.Proxy.Port() == 0 {
		return fmt.Errorf("nft: intercept needs a bridge and an IPv4 proxy address")
	}
	if cfg.Proxy6.IsValid() && !cfg.Proxy6.Addr().Is6() {
		return fmt.Errorf("nft: intercept Proxy6 %s is not IPv6", cfg.Proxy6)
	}
	ports := cfg.Ports
	if len(ports) == 0 {
		ports = []uint16{80, 443}
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nft: netlink: %w", err)
	}
	defer c.CloseLasting()
	name := InterceptTable(cfg.Bridge)
	c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	s4 := &nftables.Set{Table: t, Name: setClients4, KeyType: nftables.TypeIPAddr}
	s6 := &nftables.Set{Table: t, Name: setClients6, KeyType: nftables.TypeIP6Addr}
	for _, s := range []*nftables.Set{s4, s6} {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("nft: intercept set %s: %w", s.Name, err)
		}
	}
	policyAccept := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &policyAccept})
	fromBridge := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(cfg.Bridge)},
	}
	for _, fam := range []struct {
		set   *nftables.Set
		proxy netip.AddrPort
		proto byte
		off   uint32
		n     uint32
	}{
		{s4, cfg.Proxy, unix.NFPROTO_IPV4, 12, 4},
		{s6, cfg.Proxy6, unix.NFPROTO_IPV6, 8, 16},
	} {
		if !fam.proxy.IsValid() {
			continue
		}
		for _, port := range ports {
			c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: concat(fromBridge, []expr.Any{
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{fam.proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.off, Len: fam.n},
				lookup(fam.set),
			}, l4Port(unix.IPPROTO_TCP, port), []expr.Any{
				&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(InterceptMark)},
				&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
				&expr.Immediate{Register: 1, Data: fam.proxy.Addr().AsSlice()},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(fam.proxy.Port())},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fam.proto), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
			})})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: install intercept table %s: %w", name, err)
	}
	return nil
}

// AddInterceptClient starts redirecting ip's connections (idempotent).
func AddInterceptClient(ctx context.Context, bridge string, ip netip.Addr) error {
	return editClient(bridge, ip, true)
}

// RemoveInterceptClient stops redirecting ip's new connections
// (idempotent); established ones keep their conntrack NAT.
func RemoveInterceptClient(ctx context.Context, bridge string, ip netip.Addr) error {
	return editClient(bridge, ip, false)
}

func editClient(bridge string, ip netip.Addr, add bool) error {
	ip = ip.Unmap()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nft: netlink: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: InterceptTable(bridge)}
	s := &nftables.Set{Table: t, Name: setClients4, KeyType: nftables.TypeIPAddr}
	if ip.Is6() {
		s = &nftables.Set{Table: t, Name: setClients6, KeyType: nftables.TypeIP6Addr}
	}
	el := []nftables.SetElement{{Key: ip.AsSlice()}}
	if add {
		err = c.SetAddElements(s, el)
	} else {
		err = c.SetDeleteElements(s, el)
	}
	if err != nil {
		return fmt.Errorf("nft: intercept client %s: %w", ip, err)
	}
	if err := c.Flush(); err != nil {
		if !add && errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("nft: intercept client %s: %w", ip, err)
	}
	return nil
}

// RemoveIntercept deletes the intercept table of a bridge (idempotent).
func RemoveIntercept(ctx context.Context, bridge string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: InterceptTable(bridge)}
	c.AddTable(t)
	c.DelTable(t)
	return c.Flush()
}
