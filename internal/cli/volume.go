package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// newVolumeCommand is the `moat volume` noun: the named volumes (pvc
// claims) of a moat server's runtime.
func newVolumeCommand() *cobra.Command {
	sf := &serverFlags{}
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes", "vol"},
		Short:   "Manage named volumes (the pvc backend of sandbox volumes)",
		Long: `Named volumes are created by a sandbox create that mounts a pvc claim
(createIfNotExists, the default) and outlive the sandboxes that mount them.
They are moat-managed quota filesystems on the native runtime, Docker named
volumes on Docker, PersistentVolumeClaims on Kubernetes.`,
	}
	sf.register(cmd)
	cmd.AddCommand(
		newListCommand(sf, "List named volumes", (*client.Client).ListVolumes,
			func(tw *tabwriter.Writer, vols []client.NamedVolume) { volumeTable(tw, vols, time.Now()) }),
		newGetCommand(sf, "get NAME", nil, "Show one named volume", (*client.Client).GetVolume,
			func(tw *tabwriter.Writer, v *client.NamedVolume) { volumeDetail(tw, v, time.Now()) }),
		newRemoveCommand(sf, "rm NAME...", "Delete named volumes and their data (refused while a sandbox mounts one)",
			(*client.Client).DeleteVolume))
	return classifyTree(cmd)
}

func volumeTable(tw *tabwriter.Writer, vols []client.NamedVolume, now time.Time) {
	fmt.Fprintln(tw, "NAME\tCAPACITY\tUSED\tSANDBOXES\tMANAGED\tAGE")
	for _, v := range vols {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%v\t%s\n", v.Name, volumeBytes(v.CapacityBytes), volumeBytes(v.UsedBytes),
			len(v.Sandboxes), v.Managed, age(now, v.CreatedAt))
	}
}

func volumeDetail(tw *tabwriter.Writer, v *client.NamedVolume, now time.Time) {
	row := func(k, val string) { fmt.Fprintf(tw, "%s:\t%s\n", k, val) }
	row("Name", v.Name)
	row("Capacity", volumeBytes(v.CapacityBytes))
	row("Used", volumeBytes(v.UsedBytes))
	row("Managed", fmt.Sprint(v.Managed))
	sbs := "-"
	if len(v.Sandboxes) > 0 {
		sbs = strings.Join(v.Sandboxes, ", ")
	}
	row("Sandboxes", sbs)
	if v.StorageClass != "" {
		row("Storage class", v.StorageClass)
	}
	if len(v.AccessModes) > 0 {
		row("Access modes", strings.Join(v.AccessModes, ", "))
	}
	row("Labels", joinKV(v.Labels))
	row("Created", v.CreatedAt.Local().Format(time.DateTime)+" ("+age(now, v.CreatedAt)+" ago)")
}

// volumeBytes renders a byte count in binary units ("-" for 0: unknown
// or unlimited).
func volumeBytes(n int64) string {
	if n <= 0 {
		return "-"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f, i := float64(n), 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d%s", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}

// parseVolumeFlags turns --volume values into create-request volumes:
// "CLAIM[/SUBPATH]:PATH[:ro]" mounts a named volume (pvc), "/HOST:PATH[:ro]"
// a host path. The volumes are named v0, v1, ... in order.
func parseVolumeFlags(vals []string) ([]client.Volume, error) {
	var out []client.Volume
	for i, v := range vals {
		bad := errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--volume %q: want CLAIM[/SUBPATH]:PATH[:ro] or /HOST/PATH:PATH[:ro]", v))
		parts := strings.Split(v, ":")
		ro := false
		if len(parts) == 3 {
			if parts[2] != "ro" && parts[2] != "rw" {
				return nil, bad
			}
			ro = parts[2] == "ro"
			parts = parts[:2]
		}
		if len(parts) != 2 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") {
			return nil, bad
		}
		vol := client.Volume{Name: fmt.Sprintf("v%d", i), MountPath: parts[1], ReadOnly: ro}
		if strings.HasPrefix(parts[0], "/") {
			vol.Host = &client.HostVolume{Path: parts[0]}
		} else {
			claim, sub, _ := strings.Cut(parts[0], "/")
			vol.PVC, vol.SubPath = &client.PVCVolume{ClaimName: claim}, sub
		}
		out = append(out, vol)
	}
	return out, nil
}
