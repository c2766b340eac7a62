package cli

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/k8s/node"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
)

// newNodeCommand is moat's node component on Kubernetes (the chart's
// DaemonSet): it freezes and thaws the sandbox pods of its node as their
// pause wish asks (package node).
func newNodeCommand() *cobra.Command {
	var (
		kc, name, socket, namespace, logLevel string
		registry                              snapreg.Registry
	)
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Freeze and thaw the sandbox pods of this Kubernetes node (the chart's DaemonSet)",
		Long: `Run moat's node component: it watches the moat sandbox pods bound to
--node-name and freezes or thaws their containers through the node's
containerd (--containerd-socket) as the pods' pause wish asks, answering
with a pod condition. With --snapshot-registry it also commits the
writable layer of sandbox containers for the SandboxSnapshots the
controller hands to this node, and pushes them to that registry. It serves
no port; it needs read access to pods and patch access to pods/status
(and read access to sandboxsnapshots, update access to their status).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("log-level %q: %w", logLevel, err)
			}
			if name == "" {
				return fmt.Errorf("--node-name (or $NODE_NAME) is required")
			}
			cfg, err := kclient.Load(kc)
			if err != nil {
				return err
			}
			tasks, err := node.DialContainerd(socket, namespace)
			if err != nil {
				return err
			}
			defer tasks.Close()
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			opts := node.Options{NodeName: name, Tasks: tasks, Log: log}
			if registry.Host != "" {
				opts.Layers, opts.Registry = tasks, registry
			}
			return node.Run(cmd.Context(), cfg, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kc, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config, or in-cluster)")
	f.StringVar(&name, "node-name", os.Getenv("NODE_NAME"), "the node whose pods are served ($NODE_NAME)")
	f.StringVar(&socket, "containerd-socket", "/run/containerd/containerd.sock", "the node's containerd socket")
	f.StringVar(&namespace, "containerd-namespace", "k8s.io", "containerd namespace of the kubelet's containers")
	f.StringVar(&registry.Host, "snapshot-registry", "", "registry host[:port][/prefix] the node pushes snapshot images to (default: no snapshots; must match the controller's)")
	f.BoolVar(&registry.Insecure, "snapshot-registry-insecure", false, "speak plain HTTP to the snapshot registry")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}
