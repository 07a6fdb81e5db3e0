// Package charttest renders the gd2fs Helm chart (deploy/helm/gd2fs) with
// Helm's own Go library for several value sets, the way `helm template`
// does, and checks the objects as Kubernetes would take them: each decoded
// strictly into its Kubernetes API type (an unknown or misspelt field
// fails), required fields set, selectors matching pod labels, every Secret,
// volume, claim, port name and $(VAR) resolvable, probes on the real health
// endpoints, no `latest` image. A module of its own: Helm and the
// Kubernetes API types stay out of the product's go.mod.
//
//	cd deploy/helm/charttest && go test ./...   (scripts/test.sh runs it)
package charttest

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "../gd2fs"

// objects is one rendering, decoded.
type objects struct {
	deployments  []appsv1.Deployment
	statefulSets []appsv1.StatefulSet
	services     []corev1.Service
	pvcs         []corev1.PersistentVolumeClaim
	pdbs         []policyv1.PodDisruptionBudget
	secrets      []corev1.Secret
	custom       []map[string]any // ServiceMonitor, PrometheusRule
	notes        string
}

func load(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// render is `helm template rel <chart> -n ns -f values`.
func render(t *testing.T, c *chart.Chart, values string) (*objects, error) {
	t.Helper()
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{Name: "rel", Namespace: "ns", IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(c, rv)
	if err != nil {
		return nil, err
	}
	out := &objects{}
	for name, text := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			out.notes = text
			continue
		}
		for i, doc := range splitDocs(text) {
			if err := out.add(doc); err != nil {
				t.Fatalf("%s, document %d: %v\n%s", name, i, err, doc)
			}
		}
	}
	return out, nil
}

func splitDocs(text string) []string {
	var docs []string
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// add decodes one document strictly into its API type.
func (o *objects) add(doc string) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
		return err
	}
	strict := func(v any) error { return yaml.UnmarshalStrict([]byte(doc), v) }
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 Deployment":
		var v appsv1.Deployment
		o.deployments = append(o.deployments, v)
		return strict(&o.deployments[len(o.deployments)-1])
	case "apps/v1 StatefulSet":
		var v appsv1.StatefulSet
		o.statefulSets = append(o.statefulSets, v)
		return strict(&o.statefulSets[len(o.statefulSets)-1])
	case "v1 Service":
		var v corev1.Service
		o.services = append(o.services, v)
		return strict(&o.services[len(o.services)-1])
	case "v1 PersistentVolumeClaim":
		var v corev1.PersistentVolumeClaim
		o.pvcs = append(o.pvcs, v)
		return strict(&o.pvcs[len(o.pvcs)-1])
	case "policy/v1 PodDisruptionBudget":
		var v policyv1.PodDisruptionBudget
		o.pdbs = append(o.pdbs, v)
		return strict(&o.pdbs[len(o.pdbs)-1])
	case "v1 Secret":
		var v corev1.Secret
		o.secrets = append(o.secrets, v)
		return strict(&o.secrets[len(o.secrets)-1])
	case "monitoring.coreos.com/v1 ServiceMonitor", "monitoring.coreos.com/v1 PrometheusRule":
		var v map[string]any
		if err := strict(&v); err != nil {
			return err
		}
		o.custom = append(o.custom, v)
		return nil
	}
	return fmt.Errorf("unexpected object %s %s", head.APIVersion, head.Kind)
}

// workload is a Deployment's or StatefulSet's pod side.
type workload struct {
	kind, name string
	selector   map[string]string
	pod        corev1.PodTemplateSpec
	claims     map[string]bool // volumeClaimTemplates
}

func (o *objects) workloads() []workload {
	var ws []workload
	for _, d := range o.deployments {
		ws = append(ws, workload{"Deployment", d.Name, d.Spec.Selector.MatchLabels, d.Spec.Template, nil})
	}
	for _, s := range o.statefulSets {
		cl := map[string]bool{}
		for _, c := range s.Spec.VolumeClaimTemplates {
			cl[c.Name] = true
		}
		ws = append(ws, workload{"StatefulSet", s.Name, s.Spec.Selector.MatchLabels, s.Spec.Template, cl})
	}
	return ws
}

func matches(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// secretsHave: the Secrets the operator created before installing (name to
// keys), and the ones the chart renders.
func (o *objects) secretKeys(given map[string][]string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for n, keys := range given {
		out[n] = map[string]bool{}
		for _, k := range keys {
			out[n][k] = true
		}
	}
	for _, s := range o.secrets {
		out[s.Name] = map[string]bool{}
		for k := range s.Data {
			out[s.Name][k] = true
		}
		for k := range s.StringData {
			out[s.Name][k] = true
		}
	}
	return out
}

var version = func() string {
	b, err := os.ReadFile("../../../internal/version/VERSION")
	if err != nil {
		panic(err)
	}
	return strings.TrimSpace(string(b))
}()

// reporter is the part of testing.TB checkAll reports through (a recorder
// in TestSecretRefsChecked).
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

type recorder struct{ errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// checkAll is what every rendering must satisfy.
func checkAll(t reporter, o *objects, given map[string][]string) {
	t.Helper()
	secrets := o.secretKeys(given)
	pvcs := map[string]bool{}
	for _, p := range o.pvcs {
		pvcs[p.Name] = true
		if len(p.Spec.AccessModes) == 0 || p.Spec.Resources.Requests.Storage().IsZero() {
			t.Errorf("PVC %s: access modes %v, size %v", p.Name, p.Spec.AccessModes, p.Spec.Resources.Requests.Storage())
		}
	}
	ws := o.workloads()
	if len(ws) != 2 {
		t.Errorf("%d workloads, want the masters' Deployment and the servers' StatefulSet", len(ws))
	}
	for _, w := range ws {
		where := w.kind + " " + w.name
		if !matches(w.selector, w.pod.Labels) {
			t.Errorf("%s: selector %v does not match its pod labels %v", where, w.selector, w.pod.Labels)
		}
		ps := w.pod.Spec
		if ps.SecurityContext == nil || ps.SecurityContext.FSGroup == nil {
			t.Errorf("%s: no pod fsGroup (volumes would not be writable by uid 65532)", where)
		}
		if ps.Affinity == nil || ps.Affinity.PodAntiAffinity == nil {
			t.Errorf("%s: no pod anti-affinity", where)
		}
		vols := map[string]corev1.Volume{}
		for _, v := range ps.Volumes {
			vols[v.Name] = v
			if v.Secret != nil {
				keys, ok := secrets[v.Secret.SecretName]
				if !ok {
					t.Errorf("%s: volume %s names Secret %q, which neither the chart nor the operator creates", where, v.Name, v.Secret.SecretName)
					continue
				}
				for _, it := range v.Secret.Items {
					if !keys[it.Key] {
						t.Errorf("%s: volume %s: Secret %s has no key %q", where, v.Name, v.Secret.SecretName, it.Key)
					}
				}
			}
			if v.PersistentVolumeClaim != nil && !pvcs[v.PersistentVolumeClaim.ClaimName] {
				t.Errorf("%s: volume %s names PVC %q, which the chart does not create", where, v.Name, v.PersistentVolumeClaim.ClaimName)
			}
		}
		if len(ps.Containers) == 0 {
			t.Errorf("%s: no containers", where)
		}
		for _, c := range ps.Containers {
			cw := where + " container " + c.Name
			repo, tag, ok := strings.Cut(c.Image, ":")
			if !ok || repo == "" || tag == "" || tag == "latest" || strings.Contains(tag, "latest") {
				t.Errorf("%s: image %q: want a pinned tag, never latest", cw, c.Image)
			}
			if c.SecurityContext == nil || c.SecurityContext.RunAsNonRoot == nil || !*c.SecurityContext.RunAsNonRoot ||
				c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
				t.Errorf("%s: not non-root with a read-only root filesystem: %+v", cw, c.SecurityContext)
			}
			ports := map[string]int32{}
			for _, p := range c.Ports {
				if p.Name == "" || p.ContainerPort == 0 {
					t.Errorf("%s: port %+v needs a name and a number", cw, p)
				}
				ports[p.Name] = p.ContainerPort
			}
			if port := w.pod.Annotations["prometheus.io/port"]; port != "" {
				found := false
				for _, p := range ports {
					found = found || fmt.Sprint(p) == port
				}
				if !found {
					t.Errorf("%s: prometheus.io/port %s is not a container port (%v)", cw, port, ports)
				}
			}
			if c.ReadinessProbe == nil || c.LivenessProbe == nil {
				t.Errorf("%s: readiness %v, liveness %v: want both", cw, c.ReadinessProbe, c.LivenessProbe)
			}
			for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
				if p == nil {
					continue
				}
				var port string
				switch {
				case p.HTTPGet != nil:
					want := map[string]string{"readiness": "/readyz", "liveness": "/healthz", "startup": "/healthz"}[kind]
					if p.HTTPGet.Path != want {
						t.Errorf("%s: %s probe on %s, want %s", cw, kind, p.HTTPGet.Path, want)
					}
					port = p.HTTPGet.Port.String()
				case p.TCPSocket != nil:
					port = p.TCPSocket.Port.String()
				default:
					t.Errorf("%s: %s probe is neither HTTP nor TCP", cw, kind)
				}
				if _, ok := ports[port]; !ok {
					t.Errorf("%s: %s probe on port %q, not one of the container's (%v)", cw, kind, port, ports)
				}
			}
			env := map[string]bool{}
			for _, e := range c.Env {
				env[e.Name] = true
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					r := e.ValueFrom.SecretKeyRef
					if keys, ok := secrets[r.Name]; !ok || !keys[r.Key] {
						t.Errorf("%s: env %s reads Secret %s key %s, which does not exist", cw, e.Name, r.Name, r.Key)
					}
				}
			}
			for _, a := range c.Args {
				for _, m := range regexp.MustCompile(`\$\(([A-Z_]+)\)`).FindAllStringSubmatch(a, -1) {
					if !env[m[1]] {
						t.Errorf("%s: arg %q uses $(%s), not in the container's env", cw, a, m[1])
					}
				}
			}
			for _, m := range c.VolumeMounts {
				if _, ok := vols[m.Name]; !ok && !w.claims[m.Name] {
					t.Errorf("%s: mount %s names no volume", cw, m.Name)
				}
				if m.SubPathExpr != "" {
					for _, v := range regexp.MustCompile(`\$\(([A-Z_]+)\)`).FindAllStringSubmatch(m.SubPathExpr, -1) {
						if !env[v[1]] {
							t.Errorf("%s: subPathExpr uses $(%s), not in env", cw, v[1])
						}
					}
				}
			}
		}
	}
	for _, s := range o.services {
		var hit *workload
		for i := range ws {
			if matches(s.Spec.Selector, ws[i].pod.Labels) {
				if hit != nil {
					t.Errorf("Service %s selects pods of both %s and %s", s.Name, hit.name, ws[i].name)
				}
				hit = &ws[i]
			}
		}
		if hit == nil {
			t.Errorf("Service %s: selector %v matches no pods", s.Name, s.Spec.Selector)
			continue
		}
		for _, p := range s.Spec.Ports {
			found := false
			for _, c := range hit.pod.Spec.Containers {
				for _, cp := range c.Ports {
					found = found || cp.Name == p.TargetPort.String() || fmt.Sprint(cp.ContainerPort) == p.TargetPort.String()
				}
			}
			if !found {
				t.Errorf("Service %s port %s: target %s is no port of %s", s.Name, p.Name, p.TargetPort.String(), hit.name)
			}
		}
	}
	for _, p := range o.pdbs {
		n := 0
		for _, w := range ws {
			if matches(p.Spec.Selector.MatchLabels, w.pod.Labels) {
				n++
			}
		}
		if n != 1 || (p.Spec.MaxUnavailable == nil && p.Spec.MinAvailable == nil) {
			t.Errorf("PodDisruptionBudget %s selects %d workloads (want 1), budget %v/%v", p.Name, n, p.Spec.MaxUnavailable, p.Spec.MinAvailable)
		}
	}
	for _, s := range o.statefulSets {
		found := false
		for _, svc := range o.services {
			found = found || (svc.Name == s.Spec.ServiceName && svc.Spec.ClusterIP == corev1.ClusterIPNone)
		}
		if !found {
			t.Errorf("StatefulSet %s: serviceName %q is not a headless Service of the chart", s.Name, s.Spec.ServiceName)
		}
	}
}

func (o *objects) deployment(t *testing.T) appsv1.Deployment {
	t.Helper()
	if len(o.deployments) != 1 {
		t.Fatalf("%d Deployments", len(o.deployments))
	}
	return o.deployments[0]
}

func (o *objects) statefulSet(t *testing.T) appsv1.StatefulSet {
	t.Helper()
	if len(o.statefulSets) != 1 {
		t.Fatalf("%d StatefulSets", len(o.statefulSets))
	}
	return o.statefulSets[0]
}

func envOf(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func hasArg(c corev1.Container, prefix string) string {
	for _, a := range c.Args {
		if strings.HasPrefix(a, prefix) {
			return a
		}
	}
	return ""
}

// TestChartVersion: the chart's appVersion, the image tag it renders and
// gd2fs --version are one number; the chart's copy of the alert rules is
// deploy/prometheus's.
func TestChartVersion(t *testing.T) {
	c := load(t)
	if c.Metadata.AppVersion != version {
		t.Fatalf("Chart.yaml appVersion %q, internal/version/VERSION %q: bump them together", c.Metadata.AppVersion, version)
	}
	a, err := os.ReadFile("../../prometheus/gd2fs-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(chartDir + "/files/gd2fs-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("deploy/helm/gd2fs/files/gd2fs-alerts.yml differs from deploy/prometheus/gd2fs-alerts.yml: cp the latter over the former")
	}
}

// TestDefaults: SQLite, one master on a PVC kept on uninstall, three
// servers on per-pod PVCs, no token (and NOTES says so).
func TestDefaults(t *testing.T) {
	o, err := render(t, load(t), ``)
	if err != nil {
		t.Fatal(err)
	}
	checkAll(t, o, nil)
	d := o.deployment(t)
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("SQLite masters: %d replicas, strategy %s; want 1, Recreate", *d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	mc := d.Spec.Template.Spec.Containers[0]
	if e := envOf(mc, "GD2FS_META"); e == nil || e.Value != "sqlite:///var/lib/gd2fs/meta.db" {
		t.Errorf("GD2FS_META = %+v", e)
	}
	if mc.Image != "localhost/gd2fs:"+version {
		t.Errorf("image %s, want localhost/gd2fs:%s", mc.Image, version)
	}
	if len(o.pvcs) != 1 || o.pvcs[0].Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("PVCs %+v: want the metadata PVC, kept on uninstall", o.pvcs)
	}
	for _, p := range o.pdbs {
		if strings.HasSuffix(p.Name, "-master") {
			t.Errorf("a PDB for a single master: it could never be drained")
		}
	}
	s := o.statefulSet(t)
	if *s.Spec.Replicas != 3 || len(s.Spec.VolumeClaimTemplates) != 1 || *s.Spec.VolumeClaimTemplates[0].Spec.StorageClassName != "local-nvme" {
		t.Errorf("servers: %d replicas, claims %+v", *s.Spec.Replicas, s.Spec.VolumeClaimTemplates)
	}
	sc := s.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--master=http://rel-gd2fs-master.ns.svc:7070", "--disk=/var/lib/gd2fs/chunks:1800GiB", "--mem=16GiB",
		"--advertise=$(POD_NAME).rel-gd2fs-server.ns.svc.cluster.local:7071"} {
		if hasArg(sc, want) != want {
			t.Errorf("server args %q lack %s", sc.Args, want)
		}
	}
	if want := "--allow-host=rel-gd2fs-master,rel-gd2fs-master.ns,rel-gd2fs-master.ns.svc,rel-gd2fs-master.ns.svc.cluster.local"; hasArg(mc, "--allow-host") != want {
		t.Errorf("master args %q: want %s (a master without a token refuses other Host names)", mc.Args, want)
	}
	if hasArg(sc, "--id") != "" {
		t.Errorf("server args %q pin --id: a pod on an empty volume would pose as the old server", sc.Args)
	}
	if a := s.Spec.Template.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "7071" {
		t.Errorf("server pod annotations %v", a)
	}
	if !strings.Contains(o.notes, "WARNING: no cluster token") {
		t.Errorf("NOTES without a token warning:\n%s", o.notes)
	}
	if len(o.custom) != 0 {
		t.Errorf("Prometheus Operator objects by default: %v", o.custom)
	}
}

// TestPostgresTLSMonitoring: two masters on a PostgreSQL URL from a
// Secret, token and TLS from Secrets, servers on hostPath NVMe directories
// (one per pod), Redis door, ServiceMonitor and PrometheusRule.
func TestPostgresTLSMonitoring(t *testing.T) {
	values := `
image: {repository: registry.example/gd2fs, tag: 0.1.0-rc1}
token: {secretName: gd2fs-token}
tls: {enabled: true, secretName: gd2fs-tls}
masters:
  postgres: {secretName: gd2fs-meta}
servers:
  replicas: 8
  kvDisk: 900GiB
  respPort: 6380
  storage: {type: hostPath, hostPath: {path: /mnt/nvme0/gd2fs}}
metrics:
  serviceMonitor: {enabled: true, labels: {release: prom}}
  prometheusRule: {enabled: true}
`
	given := map[string][]string{"gd2fs-token": {"token"}, "gd2fs-tls": {"tls.crt", "tls.key", "ca.crt"}, "gd2fs-meta": {"url"}}
	o, err := render(t, load(t), values)
	if err != nil {
		t.Fatal(err)
	}
	checkAll(t, o, given)
	d := o.deployment(t)
	if *d.Spec.Replicas != 2 || d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("PostgreSQL masters: %d replicas, strategy %+v; want 2, rolling with none unavailable", *d.Spec.Replicas, d.Spec.Strategy)
	}
	mc := d.Spec.Template.Spec.Containers[0]
	if e := envOf(mc, "GD2FS_META"); e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "gd2fs-meta" {
		t.Errorf("GD2FS_META = %+v: want the Secret", e)
	}
	if len(o.pvcs) != 0 {
		t.Errorf("PVCs on PostgreSQL: %+v", o.pvcs)
	}
	if len(o.pdbs) != 2 {
		t.Errorf("%d PDBs, want masters' and servers'", len(o.pdbs))
	}
	if mc.ReadinessProbe.HTTPGet == nil || mc.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("master readiness probe %+v: want HTTPS", mc.ReadinessProbe)
	}
	for _, e := range []string{"GD2FS_TOKEN_FILE", "GD2FS_TLS_CERT", "GD2FS_TLS_KEY", "GD2FS_TLS_CA"} {
		if envOf(mc, e) == nil {
			t.Errorf("master env lacks %s", e)
		}
	}
	if !strings.HasPrefix(hasArg(mc, "--advertise="), "--advertise=https://$(POD_IP):7070") {
		t.Errorf("master args %q", mc.Args)
	}
	s := o.statefulSet(t)
	sc := s.Spec.Template.Spec.Containers[0]
	if sc.Image != "registry.example/gd2fs:0.1.0-rc1" || *s.Spec.Replicas != 8 {
		t.Errorf("servers: image %s, %d replicas", sc.Image, *s.Spec.Replicas)
	}
	for _, want := range []string{"--master=https://rel-gd2fs-master.ns.svc:7070", "--kv-disk=/var/lib/gd2fs/kv:900GiB", "--resp-listen=:6380"} {
		if hasArg(sc, want) != want {
			t.Errorf("server args %q lack %s", sc.Args, want)
		}
	}
	if len(s.Spec.VolumeClaimTemplates) != 0 {
		t.Errorf("hostPath servers with claim templates")
	}
	var data *corev1.Volume
	for i, v := range s.Spec.Template.Spec.Volumes {
		if v.Name == "data" {
			data = &s.Spec.Template.Spec.Volumes[i]
		}
	}
	if data == nil || data.HostPath == nil || data.HostPath.Path != "/mnt/nvme0/gd2fs" {
		t.Fatalf("data volume %+v", data)
	}
	for _, m := range sc.VolumeMounts {
		if m.Name == "data" && m.SubPathExpr != "$(POD_NAME)" {
			t.Errorf("hostPath mount %+v: want a directory per pod (subPathExpr $(POD_NAME))", m)
		}
	}
	hard := s.Spec.Template.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if len(hard) != 1 || hard[0].TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("servers' anti-affinity %+v: want one per node", hard)
	}
	kinds := map[string]map[string]any{}
	for _, c := range o.custom {
		kinds[c["kind"].(string)] = c
	}
	sm, pr := kinds["ServiceMonitor"], kinds["PrometheusRule"]
	if sm == nil || pr == nil {
		t.Fatalf("want a ServiceMonitor and a PrometheusRule, got %v", kinds)
	}
	if sm["metadata"].(map[string]any)["labels"].(map[string]any)["release"] != "prom" {
		t.Errorf("ServiceMonitor labels %v", sm["metadata"])
	}
	eps := sm["spec"].(map[string]any)["endpoints"].([]any)
	ports := map[string]bool{}
	for _, e := range eps {
		ep := e.(map[string]any)
		ports[ep["port"].(string)] = true
		ca := ep["tlsConfig"].(map[string]any)["ca"].(map[string]any)["secret"].(map[string]any)
		if ca["name"] != "gd2fs-tls" || ca["key"] != "ca.crt" {
			t.Errorf("ServiceMonitor endpoint %v: CA from %v", ep, ca)
		}
	}
	for _, svc := range o.services {
		for _, p := range svc.Spec.Ports {
			if p.Name != "resp" {
				delete(ports, p.Name)
			}
		}
	}
	if len(ports) != 0 || len(eps) != 2 {
		t.Errorf("ServiceMonitor endpoints %v: port names not in any Service: %v", eps, ports)
	}
	groups := pr["spec"].(map[string]any)["groups"].([]any)
	alerts := 0
	for _, g := range groups {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			if _, ok := r.(map[string]any)["alert"]; ok {
				alerts++
			}
		}
	}
	if alerts < 5 {
		t.Errorf("PrometheusRule has %d alerts", alerts)
	}
	if strings.Contains(o.notes, "WARNING") {
		t.Errorf("NOTES warns with a token set:\n%s", o.notes)
	}
}

// TestMutualTLS: kubelet presents no client certificate, so the probes
// fall back to TCP; both roles require client certificates.
func TestMutualTLS(t *testing.T) {
	o, err := render(t, load(t), `{tls: {enabled: true, secretName: t, verifyClients: true}, masters: {postgres: {secretName: m, key: dsn}, replicas: 3, antiAffinity: hard}}`)
	if err != nil {
		t.Fatal(err)
	}
	checkAll(t, o, map[string][]string{"t": {"tls.crt", "tls.key", "ca.crt"}, "m": {"dsn"}})
	d := o.deployment(t)
	if *d.Spec.Replicas != 3 {
		t.Errorf("masters.replicas 3 rendered %d", *d.Spec.Replicas)
	}
	for _, c := range []corev1.Container{d.Spec.Template.Spec.Containers[0], o.statefulSet(t).Spec.Template.Spec.Containers[0]} {
		if c.ReadinessProbe.TCPSocket == nil || c.LivenessProbe.TCPSocket == nil {
			t.Errorf("%s: probes %+v / %+v: want TCP under mutual TLS", c.Name, c.ReadinessProbe, c.LivenessProbe)
		}
		if hasArg(c, "--tls-verify-clients") == "" {
			t.Errorf("%s: args %q lack --tls-verify-clients", c.Name, c.Args)
		}
	}
}

// TestTwoStepUpgrade: servers.imageTag keeps the servers on the old
// version while the masters move to the new one (masters before servers).
func TestTwoStepUpgrade(t *testing.T) {
	o, err := render(t, load(t), `{image: {tag: 0.2.0}, servers: {imageTag: 0.1.0}}`)
	if err != nil {
		t.Fatal(err)
	}
	checkAll(t, o, nil)
	if m, s := o.deployment(t).Spec.Template.Spec.Containers[0].Image, o.statefulSet(t).Spec.Template.Spec.Containers[0].Image; m != "localhost/gd2fs:0.2.0" || s != "localhost/gd2fs:0.1.0" {
		t.Fatalf("masters %s, servers %s", m, s)
	}
	if _, err := render(t, load(t), `{servers: {imageTag: latest}}`); err == nil || !strings.Contains(err.Error(), "latest is refused") {
		t.Fatalf("servers.imageTag latest: %v", err)
	}
}

// TestSecretRefsChecked: the checks find a Secret the operator did not
// create (the harness itself must be able to fail).
func TestSecretRefsChecked(t *testing.T) {
	o, err := render(t, load(t), `{token: {secretName: nowhere}}`)
	if err != nil {
		t.Fatal(err)
	}
	var r recorder
	checkAll(&r, o, nil)
	if len(r.errs) != 2 || !strings.Contains(r.errs[0], `Secret "nowhere"`) {
		t.Fatalf("a token Secret nobody created: the checks said %q, want it named for both workloads", r.errs)
	}
	r = recorder{}
	checkAll(&r, o, map[string][]string{"nowhere": {"other-key"}})
	if len(r.errs) != 2 || !strings.Contains(r.errs[0], `no key "token"`) {
		t.Fatalf("a token Secret without the key: the checks said %q", r.errs)
	}
}

// TestRefused: value sets the chart must refuse with a clear message.
func TestRefused(t *testing.T) {
	c := load(t)
	for values, want := range map[string]string{
		`{masters: {replicas: 2}}`:                            "needs PostgreSQL",
		`{image: {tag: latest}}`:                              "latest is refused",
		`{tls: {enabled: true}}`:                              "tls.secretName",
		`{servers: {storage: {type: emptyDir}}}`:              "write pvc or hostPath",
		`{servers: {antiAffinity: maybe}}`:                    "write hard or soft",
		`{image: {tag: latest}, masters: {replicas: 1}}`:      "latest is refused",
		`{image: {repository: r, tag: "x:latest"}}`:           "latest is refused",
		`{masters: {postgres: {secretName: s}, replicas: 0}}`: "",
	} {
		_, err := render(t, c, values)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", values, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: error %v, want one saying %q", values, err, want)
		}
	}
}
