package fork

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// Fork hygiene: a child must not be told apart from a fresh sandbox by
// what it inherited from its source.
//
//   - Agent token, secure-access token and egress token: every child's are
//     new (the core makes them for each new record; a child restored from
//     memory has its agent's token rotated before it is Running).
//   - Hostname: a child's is its own (the first 12 characters of its ID,
//     as for every sandbox). A filesystem child boots with it; a child
//     restored from memory wakes with the source's kernel state, so its
//     hostname is set again here.
//   - /etc/machine-id: rewritten in every child with 128 fresh random
//     bits (the source's is in the snapshot).
//   - Entropy: a filesystem child starts new processes, which seed from
//     the kernel afresh. A child restored from memory gets fresh kernel
//     randomness too (gVisor's getrandom and /dev/urandom read the host's
//     for every call), but a process that seeded a userspace generator
//     before the fork continues the same sequence in every child: such a
//     program must reseed after a fork (the child's metadata and
//     extensions name the operation that made it).
//   - Egress policy and Credential Vault: each child has its own (the
//     override's policy, or a copy of the source's) and its own vault CA;
//     the source's vault credentials are not copied.
type Hygiene interface {
	// Apply gives running child sb its own identity and returns it;
	// memory is set for a child restored from the source's memory.
	Apply(ctx context.Context, sb lifecycle.Sandbox, memory bool) (Identity, error)
}

// Identity is what makes a child its own.
type Identity struct {
	Hostname  string
	MachineID string
}

// AgentHygiene applies the identity through the child's agent.
type AgentHygiene struct {
	Deps lifecycle.Deps
}

// Hostname is the hostname of sandbox id (the runtimes' rule).
func Hostname(id string) string {
	if len(id) > 12 {
		id = strings.TrimRight(id[:12], "-")
	}
	return id
}

// NewMachineID returns a fresh machine ID (32 lowercase hex digits, as
// machine-id(5) has it).
func NewMachineID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// script is the shell command that applies id (the hostname only when
// set) and prints the hostname in force.
func script(id Identity) string {
	var b strings.Builder
	if id.Hostname != "" {
		fmt.Fprintf(&b, "hostname %[1]s 2>/dev/null || printf %%s %[1]s > /proc/sys/kernel/hostname; ", id.Hostname)
	}
	fmt.Fprintf(&b, "if [ -d /etc ]; then printf '%%s\\n' %[1]s > /etc/machine-id || exit 1; fi; "+
		"if [ -f /var/lib/dbus/machine-id ] && [ ! -L /var/lib/dbus/machine-id ]; then printf '%%s\\n' %[1]s > /var/lib/dbus/machine-id; fi; "+
		"cat /proc/sys/kernel/hostname", id.MachineID)
	return b.String()
}

// Apply implements Hygiene.
func (h AgentHygiene) Apply(ctx context.Context, sb lifecycle.Sandbox, memory bool) (Identity, error) {
	id := Identity{MachineID: NewMachineID()}
	if memory {
		id.Hostname = Hostname(sb.ID)
	}
	ep, err := h.Deps.Runtime.Endpoint(ctx, sb.ID, agentproto.Port)
	if err != nil {
		return id, fmt.Errorf("identity of %s: %w", sb.ID, err)
	}
	out, err := (&agentproto.Client{HTTP: h.Deps.HTTP}).Exec(ctx, ep, sb.AgentToken, script(id))
	if err != nil {
		return id, fmt.Errorf("identity of %s: %w", sb.ID, err)
	}
	id.Hostname = strings.TrimSpace(out)
	if memory && id.Hostname != Hostname(sb.ID) {
		return id, fmt.Errorf("identity of %s: hostname is %q after setting it", sb.ID, id.Hostname)
	}
	return id, nil
}
