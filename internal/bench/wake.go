package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// WakeBenchOptions configure `moat bench wake`.
type WakeBenchOptions struct {
	Target
	// Classes are the runtime classes to measure (one sandbox each per
	// action).
	Classes []string
	// Rounds is how many idle pauses and wakes each sandbox goes through.
	Rounds int
	// FillMiB is the memory each sandbox holds (a file in its /dev/shm)
	// before it idles.
	FillMiB int
}

// RunWake measures, per class, a sandbox with a 1 s idle policy that
// pauses (the freezer) side by side with one that hibernates: Rounds
// times it waits for the idle pause, then times a command through the
// server proxy from the request until its answer (the held request of a
// wake). It prints the memory a hibernation freed and its image size.
func RunWake(ctx context.Context, o WakeBenchOptions, w io.Writer, log *slog.Logger) error {
	c, image, stop, err := o.connect(ctx, "oci", 5*time.Minute, log)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(w, "moat bench wake: image %s, %d rounds, %d MiB held in /dev/shm, idle timeout 1s, %d cores\n", image, o.Rounds, o.FillMiB, nproc())
	for _, class := range o.Classes {
		for _, action := range []string{"pause", "hibernate"} {
			if err := wakeClass(ctx, c, o, image, class, action, w); err != nil {
				return fmt.Errorf("%s %s: %w", class, action, err)
			}
		}
	}
	return nil
}

var freedRe = regexp.MustCompile(`(\d+) MiB freed(?:, (\d+) MiB image)?`)

func wakeClass(ctx context.Context, c *Client, o WakeBenchOptions, image, class, action string, w io.Writer) error {
	body := map[string]any{"image": map[string]string{"uri": image}, "entrypoint": []string{"tail", "-f", "/dev/null"},
		"extensions": map[string]string{"moat.runtime": class, "moat.idle.timeout": "1", "moat.idle.action": action}}
	var sb struct{ ID string }
	if _, err := c.do(ctx, "POST", "/v1/sandboxes", body, &sb); err != nil {
		return err
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	ep := Endpoint{Endpoint: strings.TrimPrefix(c.Base, "http://") + "/sandboxes/" + sb.ID + "/proxy/44772",
		Headers: map[string]string{"X-EXECD-ACCESS-TOKEN": c.Key}}
	if o.FillMiB > 0 {
		if _, err := c.Run(ctx, ep, fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/fill bs=1M count=%d 2>/dev/null; echo ok", o.FillMiB)); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	var ds []time.Duration
	var freed, img []int
	for range o.Rounds {
		msg, err := awaitPaused(ctx, c, sb.ID, time.Minute)
		if err != nil {
			return err
		}
		if m := freedRe.FindStringSubmatch(msg); m != nil {
			n, _ := strconv.Atoi(m[1])
			freed = append(freed, n)
			if m[2] != "" {
				n, _ = strconv.Atoi(m[2])
				img = append(img, n)
			}
		}
		t0 := time.Now()
		out, err := c.Run(ctx, ep, "echo ok")
		ds = append(ds, time.Since(t0))
		if err != nil || out != "ok" {
			return fmt.Errorf("command after the wake: %q %w", out, err)
		}
		// What was only in memory is kept unless the processes restart.
		if o.FillMiB > 0 && (action == "pause" || strings.Contains(msg, "with its memory")) {
			out, err := c.Run(ctx, ep, "wc -c < /dev/shm/fill")
			if want := strconv.Itoa(o.FillMiB << 20); err != nil || strings.TrimSpace(out) != want {
				return fmt.Errorf("after the wake /dev/shm/fill has %q bytes, want %s (%v)", out, want, err)
			}
		}
	}
	fmt.Fprintf(w, "  %s, wake from %s until the held command is answered: %s\n", class, action, Summarize(ds))
	if len(freed) > 0 {
		line := fmt.Sprintf("  %s, memory freed by hibernation (the cgroup's before): first %d MiB, median %d MiB", class, freed[0], median(freed))
		if len(img) > 0 {
			line += fmt.Sprintf(", memory image on disk median %d MiB", median(img))
		}
		fmt.Fprintln(w, line)
	}
	return nil
}

// awaitPaused polls sandbox id until it is Paused and returns its status
// message.
func awaitPaused(ctx context.Context, c *Client, id string, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		var sb struct {
			Status struct{ State, Message string }
		}
		if _, err := c.do(ctx, "GET", "/v1/sandboxes/"+id, nil, &sb); err != nil {
			return "", err
		}
		if sb.Status.State == "Paused" {
			return sb.Status.Message, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("sandbox %s is %s after %s, want Paused", id, sb.Status.State, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func median(xs []int) int {
	s := append([]int(nil), xs...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
