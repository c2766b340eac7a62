package server

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/moby/moby/client"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/preflight"
	"github.com/moat-sandbox/moat/internal/runtime/docker"
)

// Preflight checks host for what cfg's backend needs (`moat doctor`
// prints the report; Run refuses to start on a failure).
func Preflight(ctx context.Context, cfg Config, host preflight.Host) preflight.Report {
	return preflight.Run(ctx, preflight.Config{
		Runtime:      cfg.Runtime,
		Root:         cfg.Root,
		CgroupParent: cfg.CgroupParent,
		DefaultClass: cfg.RuntimeClass,
		Classes:      RuntimeClasses(),
		DiskQuota:    cfg.DiskQuota != "",
	}, host)
}

// Host is the live host as cfg's backend reaches it: preflight.System
// with the Docker daemon at cfg.DockerHost and the Kubernetes API of
// cfg.Kubernetes.Kubeconfig.
func Host(cfg Config) preflight.Host {
	h := preflight.System()
	h.Docker = func(ctx context.Context) (string, error) { return dockerVersion(ctx, cfg.DockerHost) }
	h.Kubernetes = func(ctx context.Context) (string, error) { return kubernetesVersion(ctx, cfg.Kubernetes.Kubeconfig) }
	return h
}

// checkHost is the start-up gate of Run: the warnings are logged, a
// failure is the error.
func checkHost(ctx context.Context, cfg Config, host preflight.Host, log *slog.Logger) error {
	r := Preflight(ctx, cfg, host)
	for _, c := range r.With(preflight.Warn) {
		log.Warn("preflight: "+c.Detail, "check", c.Name, "fix", c.Fix)
	}
	return r.Err()
}

func dockerVersion(ctx context.Context, host string) (string, error) {
	if host == "" {
		host = docker.DefaultHost
	}
	cli, err := client.New(client.WithHost(host))
	if err != nil {
		return "", fmt.Errorf("client for %s: %w", host, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		return "", err
	}
	v, err := cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s (API %s) at %s", v.Version, v.APIVersion, host), nil
}

// kubernetesVersion reaches the API server and checks that it serves
// moat's CRDs (the BatchSandbox kind the backend creates).
func kubernetesVersion(ctx context.Context, kubeconfig string) (string, error) {
	rc, err := kclient.Load(kubeconfig)
	if err != nil {
		return "", err
	}
	rc.Timeout = 10 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return "", err
	}
	v, err := dc.ServerVersion()
	if err != nil {
		return "", fmt.Errorf("%s: %w", rc.Host, err)
	}
	gv := sbv1.GroupVersion.String()
	res, err := dc.ServerResourcesForGroupVersion(gv)
	if err != nil {
		return "", fmt.Errorf("%s serves no %s (moat's CRDs): %w", rc.Host, gv, err)
	}
	if !slices.ContainsFunc(res.APIResources, func(r metav1.APIResource) bool { return r.Name == "batchsandboxes" }) {
		return "", fmt.Errorf("%s serves %s without batchsandboxes (moat's CRDs are out of date)", rc.Host, gv)
	}
	return fmt.Sprintf("%s at %s", v.GitVersion, rc.Host), nil
}
