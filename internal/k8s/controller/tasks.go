package controller

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// AnnoTasks records the task started in each pod of a batch: {"<pod>":
// "<agent command id>"}. One write records every task started by one
// reconcile; a restarted controller polls the recorded commands instead of
// starting them again.
const AnnoTasks = sbv1.Group + "/moat-tasks"

// taskState is what the controller knows of one pod's task.
type taskState int

const (
	taskPending taskState = iota // not started (no ready pod yet)
	taskRunning
	taskSucceeded
	taskFailed
	taskUnknown // the agent does not answer, or lost the command
)

// taskResult is the last observed state of a task.
type taskResult struct {
	state taskState
	msg   string
}

// taskRunner runs a batch's taskTemplate in its sandboxes through moat's
// agent in each pod (POST /command in the background, then GET
// /command/status/{id}); no sidecar or ptrace is needed. Final results are
// cached per pod and command; running ones are polled on each reconcile.
type taskRunner struct {
	// c reads agent token Secrets straight from the API server (a cache
	// of every Secret in the cluster is not worth one read per task).
	c    client.Reader
	http *http.Client

	mu   sync.Mutex
	done map[string]taskResult // "<ns>/<pod>/<id>" -> final result
	// unrecorded are started tasks ("<ns>/<pod>" -> id) whose ids are not
	// yet in their batch's annotation (its write failed): never started
	// twice by this process.
	unrecorded map[string]string
}

func newTaskRunner(c client.Reader) *taskRunner {
	return &taskRunner{c: c, done: map[string]taskResult{}, unrecorded: map[string]string{},
		http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext}}}
}

// taskOf returns claim i's task: the template with shard task patch i.
func taskOf(b *sbv1.BatchSandbox, i int) (*sbv1.TaskSpec, error) {
	if b.Spec.TaskTemplate == nil {
		return nil, nil
	}
	t := b.Spec.TaskTemplate.DeepCopy()
	if i < len(b.Spec.ShardTaskPatches) {
		if raw := b.Spec.ShardTaskPatches[i].Raw; len(raw) > 0 && string(raw) != "null" && string(raw) != "{}" {
			orig, _ := json.Marshal(t)
			out, err := strategicpatch.StrategicMergePatch(orig, raw, sbv1.TaskTemplateSpec{})
			if err != nil {
				return nil, fmt.Errorf("shard task patch %d: %w", i, err)
			}
			t = &sbv1.TaskTemplateSpec{}
			if err := json.Unmarshal(out, t); err != nil {
				return nil, fmt.Errorf("shard task patch %d: %w", i, err)
			}
		}
	}
	if t.Spec.Process == nil || len(t.Spec.Process.Command) == 0 {
		return nil, fmt.Errorf("task %d has no process command", i)
	}
	return &t.Spec, nil
}

// shellQuote joins argv into one sh command line.
func shellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// startedTasks reads a batch's task record.
func startedTasks(b *sbv1.BatchSandbox) map[string]string {
	out := map[string]string{}
	if raw := b.Annotations[AnnoTasks]; raw != "" {
		json.Unmarshal([]byte(raw), &out)
	}
	return out
}

// token returns the agent token of pod p ("" = the agent has none): the
// first container's EXECD_ACCESS_TOKEN, literal or from a Secret.
func (t *taskRunner) token(ctx context.Context, p *corev1.Pod) (string, error) {
	if len(p.Spec.Containers) == 0 {
		return "", nil
	}
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name != "EXECD_ACCESS_TOKEN" {
			continue
		}
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			return e.Value, nil
		}
		var sec corev1.Secret
		ref := e.ValueFrom.SecretKeyRef
		if err := t.c.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: ref.Name}, &sec); err != nil {
			return "", err
		}
		return string(sec.Data[ref.Key]), nil
	}
	return "", nil
}

func (t *taskRunner) call(ctx context.Context, method, url, token string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("X-EXECD-ACCESS-TOKEN", token)
	}
	return t.http.Do(req)
}

// start starts task spec in pod p (ip) and returns the agent's command id.
func (t *taskRunner) start(ctx context.Context, p *corev1.Pod, ip string, spec *sbv1.TaskSpec) (string, error) {
	token, err := t.token(ctx, p)
	if err != nil {
		return "", err
	}
	pr := spec.Process
	env := map[string]string{}
	for _, e := range pr.Env {
		env[e.Name] = e.Value
	}
	req := map[string]any{"command": shellQuote(append(append([]string{}, pr.Command...), pr.Args...)),
		"background": true, "cwd": pr.WorkingDir, "envs": env}
	if spec.TimeoutSeconds != nil && *spec.TimeoutSeconds > 0 {
		req["timeout"] = *spec.TimeoutSeconds * 1000
	}
	body, _ := json.Marshal(req)
	resp, err := t.call(ctx, http.MethodPost, "http://"+net.JoinHostPort(ip, strconv.Itoa(agentPort))+"/command", token, body)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("agent answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	// The first event (init) carries the command id; bare JSON or data:.
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := strings.TrimPrefix(strings.TrimSpace(sc.Text()), "data:")
		var ev struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(line)), &ev) == nil && ev.Type == "init" && ev.Text != "" {
			return ev.Text, nil
		}
	}
	return "", errors.New("agent sent no command id")
}

// poll returns the state of command id in pod p.
func (t *taskRunner) poll(ctx context.Context, p *corev1.Pod, ip, id string) taskResult {
	key := p.Namespace + "/" + p.Name + "/" + id
	t.mu.Lock()
	r, ok := t.done[key]
	t.mu.Unlock()
	if ok {
		return r
	}
	token, err := t.token(ctx, p)
	if err != nil {
		return taskResult{taskUnknown, err.Error()}
	}
	resp, err := t.call(ctx, http.MethodGet, "http://"+net.JoinHostPort(ip, strconv.Itoa(agentPort))+"/command/status/"+id, token, nil)
	if err != nil {
		return taskResult{taskUnknown, err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return taskResult{taskUnknown, fmt.Sprintf("agent answered %d for task %s", resp.StatusCode, id)}
	}
	var st struct {
		Running  bool   `json:"running"`
		ExitCode *int   `json:"exit_code"`
		Error    string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return taskResult{taskUnknown, err.Error()}
	}
	switch {
	case st.Running:
		return taskResult{state: taskRunning}
	case st.ExitCode != nil && *st.ExitCode == 0 && st.Error == "":
		r = taskResult{state: taskSucceeded}
	default:
		code := -1
		if st.ExitCode != nil {
			code = *st.ExitCode
		}
		r = taskResult{taskFailed, fmt.Sprintf("task in pod %s exited with code %d %s", p.Name, code, st.Error)}
	}
	t.mu.Lock()
	t.done[key] = r
	t.mu.Unlock()
	return r
}

// taskReport is the outcome of one task pass over a batch.
type taskReport struct {
	started  map[string]string // pod -> id, newly started
	finished []int             // claims whose task ended
	counts   [5]int32          // by taskState
	lastErr  string
	active   bool // some task is pending or running: look again soon
}

// run starts the tasks of ready claims that have none and polls the
// others. It writes nothing to the API: the caller records
// report.started (and the ids stay in memory until it has).
func (t *taskRunner) run(ctx context.Context, b *sbv1.BatchSandbox, rec record, pods map[string]*corev1.Pod) taskReport {
	rep := taskReport{started: map[string]string{}}
	recorded := startedTasks(b)
	t.mu.Lock()
	for k, id := range t.unrecorded {
		if ns, pod, _ := strings.Cut(k, "/"); ns == b.Namespace && recorded[pod] == "" {
			recorded[pod] = id
			rep.started[pod] = id
		}
	}
	t.mu.Unlock()
	for i, c := range rec.Claims {
		if i >= int(b.GetReplicas()) {
			break
		}
		p := pods[c.Pod]
		id := recorded[c.Pod]
		var r taskResult
		switch {
		case id != "" && (p == nil || !podReady(p)):
			// Started; the pod ended or was released: what was seen last.
			r = t.cached(b.Namespace, c.Pod, id)
		case id == "" && c.Done:
			r = taskResult{taskFailed, fmt.Sprintf("pod %s ended before its task started", c.Pod)}
		case id == "" && (c.Pod == "" || p == nil || c.IP == "" || !podReady(p)):
			r = taskResult{state: taskPending}
		default:
			if id == "" {
				spec, err := taskOf(b, i)
				if err == nil {
					id, err = t.start(ctx, p, c.IP, spec)
				}
				if err != nil {
					rep.counts[taskPending]++
					rep.active = true
					rep.lastErr = fmt.Sprintf("start task in pod %s: %v", c.Pod, err)
					continue
				}
				rep.started[c.Pod] = id
				t.mu.Lock()
				t.unrecorded[b.Namespace+"/"+c.Pod] = id
				t.mu.Unlock()
			}
			r = t.poll(ctx, p, c.IP, id)
		}
		rep.counts[r.state]++
		switch r.state {
		case taskPending, taskRunning, taskUnknown:
			rep.active = true
		case taskSucceeded, taskFailed:
			rep.finished = append(rep.finished, i)
		}
		if r.msg != "" && r.state != taskSucceeded {
			rep.lastErr = r.msg
		}
	}
	return rep
}

// recorded notes that the started ids of a batch are in its annotation.
func (t *taskRunner) recorded(ns string, started map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for pod := range started {
		delete(t.unrecorded, ns+"/"+pod)
	}
}

// cached returns a final result seen before, else unknown.
func (t *taskRunner) cached(ns, pod, id string) taskResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.done[ns+"/"+pod+"/"+id]; ok {
		return r
	}
	return taskResult{taskUnknown, "pod " + pod + " is gone and its task's end was not seen"}
}

// forget drops what the runner holds of a batch's pods.
func (t *taskRunner) forget(ns string, rec record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range rec.Claims {
		delete(t.unrecorded, ns+"/"+c.Pod)
		prefix := ns + "/" + c.Pod + "/"
		for k := range t.done {
			if strings.HasPrefix(k, prefix) {
				delete(t.done, k)
			}
		}
	}
}
