//go:build linux

package nft

import (
	"context"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// PodInterceptTable is the intercept table of a pod's network namespace
// (the egress sidecar's credential proxy).
const PodInterceptTable = "moat-vault-pod"

// PodInterceptConfig describes the redirection, inside one network
// namespace, of its outbound HTTP(S) to a credential proxy listening in
// that namespace.
type PodInterceptConfig struct {
	// ProxyPort is the proxy's port on loopback. Required.
	ProxyPort uint16
	// Exempt is the socket mark of the proxy's own upstream connections,
	// which are not redirected. It is not the egress ruleset's exempt
	// mark: those connections still pass the policy's output filter, so
	// the proxy reaches only what the sandbox itself could. Required.
	Exempt uint32
	// Ports are the TCP destination ports redirected. Default 80 and 443.
	Ports []uint16
}

// ApplyPodIntercept installs (atomically replacing) PodInterceptTable in
// the current network namespace: new TCP connections to Ports that leave
// by an interface other than loopback and do not carry cfg.Exempt are
// redirected to the proxy on loopback (the original destination stays in
// conntrack, mitm.OriginalDst). The output NAT hook runs before the
// output filter, which then filters the proxy's upstream connection.
func ApplyPodIntercept(ctx context.Context, cfg PodInterceptConfig) error {
	if cfg.ProxyPort == 0 || cfg.Exempt == 0 {
		return fmt.Errorf("nft: pod intercept needs a proxy port and an exempt mark")
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
	c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: PodInterceptTable})
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: PodInterceptTable})
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: PodInterceptTable})
	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(cfg.Exempt)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	for _, port := range ports {
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: concat(l4Port(unix.IPPROTO_TCP, port), []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(cfg.ProxyPort)},
			&expr.Redir{RegisterProtoMin: 1},
		})})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: install %s: %w", PodInterceptTable, err)
	}
	return nil
}

// RemovePodIntercept deletes PodInterceptTable (idempotent).
func RemovePodIntercept(ctx context.Context) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nft: netlink: %w", err)
	}
	defer c.CloseLasting()
	c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: PodInterceptTable})
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: PodInterceptTable})
	return c.Flush()
}
