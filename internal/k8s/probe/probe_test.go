package probe

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/moat-sandbox/moat/internal/k8s/k8stest"
)

func TestProbe(t *testing.T) {
	ctx := context.Background()
	env, err := k8stest.Start(ctx, k8stest.Options{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	for i := range 3 {
		cs := kubernetes.NewForConfigOrDie(env.Config)
		w, err := cs.CoreV1().Secrets("default").Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_ = i
		go func() {
			for range w.ResultChan() {
			}
		}()
	}
	for _, proto := range []bool{false, true} {
		cfg := rest.CopyConfig(env.Config)
		if proto {
			cfg.ContentType = "application/vnd.kubernetes.protobuf"
		}
		cs := kubernetes.NewForConfigOrDie(cfg)
		for _, size := range []int{1000, 10000, 20000, 40000, 83000} {
			b := make([]byte, size*3/4)
			rand.Read(b)
			val := []byte(base64.StdEncoding.EncodeToString(b))
			s, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d-%v", size, proto)}, Data: map[string][]byte{"t": val}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var ds []time.Duration
			for i := range 100 {
				val[i%len(val)] ^= 1
				s.Data["t"] = val
				t0 := time.Now()
				s, err = cs.CoreV1().Secrets("default").Update(ctx, s, metav1.UpdateOptions{})
				ds = append(ds, time.Since(t0))
				if err != nil {
					t.Fatal(err)
				}
			}
			slices.Sort(ds)
			t.Logf("proto=%v size=%d p50=%v p90=%v", proto, size, ds[50], ds[90])
		}
	}
	if os.Getenv("METRICS") != "" {
		cs := kubernetes.NewForConfigOrDie(env.Config)
		r, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `resource="secrets"`) && strings.Contains(l, `verb="PUT"`) && (strings.Contains(l, "_sum") || strings.Contains(l, "_count")) {
				t.Log(l)
			}
		}
		_ = http.DefaultClient
	}
}
