package kubernetes

import (
	"cmp"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestKubernetes builds every kustomization in this directory (the base,
// the overlays, the Secrets' example) and every combination of the
// components on the base, decodes each object strictly, and checks the
// pods against the dpnode built from this source tree.
func TestKubernetes(t *testing.T) {
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	builds, components, err := kustomizations(root)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(components)
	if want := composedComponents(); !slices.Equal(components, want) {
		t.Errorf("components: %q; the compositions tested: %q", components, want)
	}
	flags := dpnodeJoinFlags(t)
	example, err := render(filepath.Join(root, "secrets-example"))
	if err != nil {
		t.Fatalf("secrets-example: %v", err)
	}
	for _, dir := range builds {
		t.Run(dir, func(t *testing.T) {
			r, err := render(filepath.Join(root, dir))
			if err != nil {
				t.Fatal(err)
			}
			check(t, r, example.secrets, flags)
		})
	}
	for _, c := range compositions() {
		t.Run(c.name(), func(t *testing.T) {
			dir := t.TempDir()
			if err := writeComposition(dir, root, c); err != nil {
				t.Fatal(err)
			}
			r, err := render(dir)
			if err != nil {
				t.Fatal(err)
			}
			check(t, r, example.secrets, flags)
		})
	}
}

// pod is a StatefulSet's pod template and what its dpnode container does.
type pod struct {
	set       *appsv1.StatefulSet
	spec      *corev1.PodSpec
	container *corev1.Container
	args      *joinArgs
	// ports are the ports dpnode opens with args.
	ports []openPort
}

func (p *pod) String() string { return "StatefulSet " + p.set.Name }

// selectedBy reports whether the pods carry the labels sel asks for.
func (p *pod) selectedBy(sel labels.Selector) bool {
	return !sel.Empty() && sel.Matches(labels.Set(p.set.Spec.Template.Labels))
}

// containerPort finds the container's port that a Service or a probe
// names, by name or by number, of the given protocol.
func (p *pod) containerPort(target intstr.IntOrString, protocol corev1.Protocol) (corev1.ContainerPort, bool) {
	for _, cp := range p.container.Ports {
		if cmp.Or(cp.Protocol, corev1.ProtocolTCP) != cmp.Or(protocol, corev1.ProtocolTCP) {
			continue
		}
		if (target.Type == intstr.String && cp.Name == target.StrVal) || (target.Type == intstr.Int && cp.ContainerPort == target.IntVal) {
			return cp, true
		}
	}
	return corev1.ContainerPort{}, false
}

// httpPort reports whether target names a port where dpnode answers HTTP.
func (p *pod) httpPort(target intstr.IntOrString) bool {
	cp, ok := p.containerPort(target, corev1.ProtocolTCP)
	return ok && slices.ContainsFunc(p.ports, func(o openPort) bool { return o.http && o.port == cp.ContainerPort })
}

// check runs every check on what one kustomization renders. secrets are
// the Secrets the pods may read besides those of the render.
func check(t *testing.T, r *rendered, secrets []*corev1.Secret, flags map[string]joinFlag) {
	keys := map[string]map[string]bool{}
	for _, s := range slices.Concat(secrets, r.secrets) {
		keys[s.Name] = map[string]bool{}
		for k := range s.Data {
			keys[s.Name][k] = true
		}
		for k := range s.StringData {
			keys[s.Name][k] = true
		}
	}
	var pods []*pod
	for _, set := range r.statefulSets {
		p, errs := newPod(set, flags)
		for _, err := range errs {
			t.Errorf("StatefulSet %s: %v", set.Name, err)
		}
		if p == nil {
			continue
		}
		pods = append(pods, p)
		for _, err := range slices.Concat(p.checkFlags(), p.checkProbes(), p.checkShutdown(), p.checkVolumes(keys, r), p.checkGPUs()) {
			t.Errorf("%s: %v", p, err)
		}
	}
	for _, err := range slices.Concat(checkCluster(r, pods), checkServices(r, pods), checkBudgets(r, pods), checkServiceMonitors(r, pods)) {
		t.Error(err)
	}
}

// newPod reads a StatefulSet's dpnode container: its args, and the ports
// they open, which must be the ports it declares.
func newPod(set *appsv1.StatefulSet, flags map[string]joinFlag) (*pod, []error) {
	spec := &set.Spec.Template.Spec
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return imageName(c.Image) == "dpnode" })
	if i < 0 {
		return nil, []error{fmt.Errorf("no container runs the dpnode image")}
	}
	c := &spec.Containers[i]
	if len(c.Command) > 0 {
		return nil, []error{fmt.Errorf("container %s sets command %q: the image's entrypoint is dpnode, give args only", c.Name, c.Command)}
	}
	args, errs := parseJoinArgs(expandEnv(c), flags)
	if args == nil {
		return nil, errs
	}
	p := &pod{set: set, spec: spec, container: c, args: args}
	var err error
	if p.ports, err = args.openPorts(); err != nil {
		return nil, append(errs, err)
	}
	for _, cp := range c.Ports {
		proto := cmp.Or(cp.Protocol, corev1.ProtocolTCP)
		if !slices.ContainsFunc(p.ports, func(o openPort) bool { return o.port == cp.ContainerPort && o.protocol == proto }) {
			errs = append(errs, fmt.Errorf("containerPort %s %d/%s: dpnode opens no such port with these args (it opens %s)", cp.Name, cp.ContainerPort, proto, describePorts(p.ports)))
		}
	}
	for _, o := range p.ports {
		if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
			return cp.ContainerPort == o.port && cmp.Or(cp.Protocol, corev1.ProtocolTCP) == o.protocol
		}) {
			errs = append(errs, fmt.Errorf("dpnode opens %d/%s (%s), which the container does not declare: Services and probes cannot name it", o.port, o.protocol, o.what))
		}
	}
	return p, errs
}

func describePorts(ports []openPort) string {
	var s []string
	for _, o := range ports {
		s = append(s, fmt.Sprintf("%d/%s", o.port, o.protocol))
	}
	return strings.Join(s, ", ")
}

// imageName is an image reference's last path element, without tag or
// digest.
func imageName(image string) string {
	image = image[strings.LastIndex(image, "/")+1:]
	image, _, _ = strings.Cut(image, "@")
	image, _, _ = strings.Cut(image, ":")
	return image
}

// envRef is $(NAME) in args, which the kubelet replaces with the
// container's variable NAME, and leaves as it is when there is none.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// podIPStandIn stands for $(POD_IP) and the like when a flag's value is
// checked: a documentation address.
const podIPStandIn = "192.0.2.1"

// expandEnv returns the container's args with $(NAME) expanded as the
// kubelet would, standing in for values known only in the running pod. A
// variable the container does not define is left as it is, and shows as
// an error in checkFlags.
func expandEnv(c *corev1.Container) []string {
	vars := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			vars[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && strings.HasSuffix(e.ValueFrom.FieldRef.FieldPath, "IP"):
			vars[e.Name] = podIPStandIn
		default:
			vars[e.Name] = "$(" + e.Name + ")"
		}
	}
	var out []string
	for _, a := range c.Args {
		out = append(out, envRef.ReplaceAllStringFunc(a, func(ref string) string {
			if v, ok := vars[envRef.FindStringSubmatch(ref)[1]]; ok {
				return v
			}
			return ref
		}))
	}
	return out
}

// env returns the container's variable called name, and whether it has
// one.
func (p *pod) env(name string) (corev1.EnvVar, bool) {
	i := slices.IndexFunc(p.container.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return corev1.EnvVar{}, false
	}
	return p.container.Env[i], true
}

// checkFlags checks what dpnode itself would refuse at start, or what
// would start but not work in a pod.
func (p *pod) checkFlags() []error {
	var errs []error
	for _, a := range p.container.Args {
		for _, m := range envRef.FindAllStringSubmatch(a, -1) {
			if _, ok := p.env(m[1]); !ok {
				errs = append(errs, fmt.Errorf("%s: the container has no variable %s, so the kubelet passes $(%s) as it is", a, m[1], m[1]))
			}
		}
	}
	a := p.args
	bindHost, _, _ := splitHostPort(a.get("bind"), 7946)
	if ip := net.ParseIP(bindHost); bindHost == "localhost" || (ip != nil && ip.IsLoopback()) {
		errs = append(errs, fmt.Errorf("--bind=%s: gossip on loopback is out of other pods' reach", a.get("bind")))
	} else {
		// dpnode refuses cluster ports beyond loopback without these.
		_, keyEnv := p.env("DPNODE_GOSSIP_KEY")
		tls := a.has("cluster-tls-cert") && a.has("cluster-tls-key") && a.has("cluster-tls-ca")
		if !a.bool("insecure-cluster") && (!tls || !(keyEnv || a.has("gossip-key"))) {
			errs = append(errs, fmt.Errorf("--bind=%s beyond loopback needs a gossip key (DPNODE_GOSSIP_KEY) and --cluster-tls-cert, -key and -ca, or --insecure-cluster: dpnode refuses to start", a.get("bind")))
		}
	}
	if ip := net.ParseIP(a.get("host")); a.get("host") == "localhost" || (ip != nil && ip.IsLoopback()) {
		errs = append(errs, fmt.Errorf("--host=%s: the kubelet probes and Services reach the pod at its IP, not its loopback", a.get("host")))
	}
	if a.bool("headless") {
		if _, ok := p.env("DPNODE_API_KEY"); ok || a.has("api-key") || a.has("api-key-file") {
			errs = append(errs, fmt.Errorf("--headless with an API key: dpnode refuses it (a headless node serves no API)"))
		}
	}
	if a.get("data-parallel-rpc-port") == "0" {
		errs = append(errs, fmt.Errorf("--data-parallel-rpc-port=0 picks a port at start, which no manifest can name"))
	}
	return errs
}

// checkProbes checks the startup, readiness and liveness probes: each asks
// /health on a port where dpnode answers HTTP.
func (p *pod) checkProbes() []error {
	var errs []error
	for _, probe := range []struct {
		what  string
		probe *corev1.Probe
	}{{"startupProbe", p.container.StartupProbe}, {"readinessProbe", p.container.ReadinessProbe}, {"livenessProbe", p.container.LivenessProbe}} {
		switch {
		case probe.probe == nil:
			errs = append(errs, fmt.Errorf("no %s", probe.what))
		case probe.probe.HTTPGet == nil:
			errs = append(errs, fmt.Errorf("%s: not an httpGet of /health", probe.what))
		case probe.probe.HTTPGet.Path != "/health":
			errs = append(errs, fmt.Errorf("%s: path %q, not /health", probe.what, probe.probe.HTTPGet.Path))
		case !p.httpPort(probe.probe.HTTPGet.Port):
			errs = append(errs, fmt.Errorf("%s: port %s is not one where dpnode serves HTTP with these args (%s)", probe.what, probe.probe.HTTPGet.Port.String(), describePorts(p.ports)))
		}
	}
	return errs
}

// How long a node takes to stop beyond its drain, as node.Running's
// shutdown bounds it: giving its ranks back (releaseTimeout, with
// --leave-on-terminate), closing the HTTP server, leaving gossip.
const (
	releaseTime  = 10 * time.Second
	stopOverhead = 5*time.Second + 2*time.Second
)

// probeBudget is how long a probe may fail before the kubelet acts.
func probeBudget(probe *corev1.Probe) time.Duration {
	if probe == nil {
		return 0
	}
	period, failures := cmp.Or(probe.PeriodSeconds, 10), cmp.Or(probe.FailureThreshold, 3)
	return time.Duration(period*failures) * time.Second
}

// checkShutdown checks that the kubelet gives a node time to drain and
// to join: the grace period covers the preStop pause, --drain-timeout and
// the leave; liveness outlasts a drain or a leave that POST /admin/drain or
// /admin/leave started (no SIGTERM, so the kubelet still acts on
// liveness, which fails while the node drains); the startup probe
// outlasts the join, which waits up to --join-timeout for a seed, then,
// where the coordinator gives out the ranks, as long again for them.
func (p *pod) checkShutdown() []error {
	var errs []error
	stop := p.args.duration("drain-timeout") + stopOverhead
	if p.args.bool("leave-on-terminate") {
		stop += releaseTime
	}
	var pause time.Duration
	if l := p.container.Lifecycle; l != nil && l.PreStop != nil {
		if l.PreStop.Sleep == nil {
			errs = append(errs, fmt.Errorf("a preStop other than sleep: this test cannot tell how long it takes"))
		} else {
			pause = time.Duration(l.PreStop.Sleep.Seconds) * time.Second
		}
	}
	grace := 30 * time.Second
	if g := p.spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if need := pause + stop; grace < need {
		errs = append(errs, fmt.Errorf("terminationGracePeriodSeconds %v is shorter than the preStop pause (%v), --drain-timeout and the leave (%v): the kubelet would kill the drain", grace, pause, stop))
	}
	leave := p.args.duration("drain-timeout") + releaseTime + stopOverhead
	if live := probeBudget(p.container.LivenessProbe); live < leave {
		errs = append(errs, fmt.Errorf("liveness fails for %v before a restart, less than a drain and a leave (%v): a node that POST /admin/leave takes out would be killed", live, leave))
	}
	join := p.args.duration("join-timeout")
	if !p.args.has("seeds") {
		join = 0
	}
	if given := p.args.get("data-parallel-size") == "auto" || p.args.get("data-parallel-start-rank") == "auto"; given && p.args.int("data-parallel-size-local") != 0 {
		join += p.args.duration("join-timeout")
	}
	if start := probeBudget(p.container.StartupProbe); start < join {
		errs = append(errs, fmt.Errorf("startupProbe gives up after %v, before a join with --join-timeout=%v may end (%v)", start, p.args.get("join-timeout"), join))
	}
	return errs
}

// fileFlags are the flags whose value is a file the node reads.
var fileFlags = []string{"api-key-file", "cluster-tls-cert", "cluster-tls-key", "cluster-tls-ca", "chat-template"}

// checkVolumes checks that each file a flag names lies in a volume the
// container mounts, that a Secret's file is one of the Secret's keys, and
// that the variables taken from Secrets name keys that exist.
func (p *pod) checkVolumes(keys map[string]map[string]bool, r *rendered) []error {
	var errs []error
	files := fileFlags
	if p.args.get("engine") == "llamacpp" {
		files = append(slices.Clone(files), "model")
	}
	for _, flag := range files {
		path := p.args.get(flag)
		if path == "" {
			continue
		}
		var mount *corev1.VolumeMount
		for i, m := range p.container.VolumeMounts {
			if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") && (mount == nil || len(m.MountPath) > len(mount.MountPath)) {
				mount = &p.container.VolumeMounts[i]
			}
		}
		if mount == nil {
			errs = append(errs, fmt.Errorf("--%s=%s lies in no volume the container mounts", flag, path))
			continue
		}
		i := slices.IndexFunc(p.spec.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("volumeMount %s: no such volume", mount.Name))
			continue
		}
		v := p.spec.Volumes[i]
		rel := strings.TrimPrefix(path, strings.TrimSuffix(mount.MountPath, "/")+"/")
		switch {
		case v.Secret != nil:
			if mount.SubPath != "" {
				errs = append(errs, fmt.Errorf("--%s: a subPath mount of a Secret never sees the Secret change", flag))
			}
			key := rel
			if len(v.Secret.Items) > 0 {
				j := slices.IndexFunc(v.Secret.Items, func(it corev1.KeyToPath) bool { return it.Path == rel })
				if j < 0 {
					errs = append(errs, fmt.Errorf("--%s=%s: the Secret volume %s projects no such path", flag, path, v.Name))
					continue
				}
				key = v.Secret.Items[j].Key
			}
			if !keys[v.Secret.SecretName][key] {
				errs = append(errs, fmt.Errorf("--%s=%s: Secret %s has no key %s", flag, path, v.Secret.SecretName, key))
			}
		case v.PersistentVolumeClaim != nil:
			if !slices.ContainsFunc(r.claims, func(c *corev1.PersistentVolumeClaim) bool { return c.Name == v.PersistentVolumeClaim.ClaimName }) {
				errs = append(errs, fmt.Errorf("--%s=%s: volume %s claims %s, which this build does not hold", flag, path, v.Name, v.PersistentVolumeClaim.ClaimName))
			}
		}
	}
	for _, e := range p.container.Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		if !keys[ref.Name][ref.Key] && (ref.Optional == nil || !*ref.Optional) {
			errs = append(errs, fmt.Errorf("variable %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key))
		}
	}
	return errs
}

// gpuResource is the NVIDIA device plugin's resource.
const gpuResource corev1.ResourceName = "nvidia.com/gpu"

// checkGPUs checks one GPU per local rank: asked of the device plugin, or,
// on a pod without GPUs, as many virtual ones.
func (p *pod) checkGPUs() []error {
	local := p.args.int("data-parallel-size-local")
	if local < 0 {
		return []error{fmt.Errorf("no --data-parallel-size-local: the pod's ranks would follow the GPUs NVML finds, which the manifest should say")}
	}
	if _, ok := p.env("NVIDIA_VISIBLE_DEVICES"); ok {
		return []error{fmt.Errorf("NVIDIA_VISIBLE_DEVICES is the device plugin's to set: set by hand it hands the pod GPUs the scheduler did not give it")}
	}
	limit, ok := p.container.Resources.Limits[gpuResource]
	if !ok {
		if gpus := p.args.int("gpus"); gpus < local {
			return []error{fmt.Errorf("no %s asked for and --gpus=%d virtual GPUs for --data-parallel-size-local=%d ranks", gpuResource, gpus, local)}
		}
		return nil
	}
	var errs []error
	if limit.Value() != int64(local) {
		errs = append(errs, fmt.Errorf("%s limit %s for --data-parallel-size-local=%d: one GPU per rank", gpuResource, limit.String(), local))
	}
	if req, ok := p.container.Resources.Requests[gpuResource]; ok && !req.Equal(limit) {
		errs = append(errs, fmt.Errorf("%s request %s differs from its limit %s", gpuResource, req.String(), limit.String()))
	}
	return errs
}

// firstLabel is the Service name in a DNS name (svc, svc.ns, svc.ns.svc...).
func firstLabel(host string) string {
	name, _, _ := strings.Cut(host, ".")
	return name
}

// service finds a Service of the render by name.
func (r *rendered) service(name string) *corev1.Service {
	i := slices.IndexFunc(r.services, func(s *corev1.Service) bool { return s.Name == name })
	if i < 0 {
		return nil
	}
	return r.services[i]
}

// checkPeers checks that svc is a headless Service that publishes this
// pod before it is ready, as gossip needs.
func checkPeers(svc *corev1.Service, p *pod) error {
	switch {
	case svc.Spec.ClusterIP != corev1.ClusterIPNone:
		return fmt.Errorf("Service %s is not headless (clusterIP: None): its name resolves to one virtual IP, not to every pod", svc.Name)
	case !svc.Spec.PublishNotReadyAddresses:
		return fmt.Errorf("Service %s does not publish pods that are not ready, but a pod gossips before it is ready", svc.Name)
	case !p.selectedBy(labels.SelectorFromSet(svc.Spec.Selector)):
		return fmt.Errorf("Service %s does not select the pods of %s", svc.Name, p)
	}
	return nil
}

// checkCluster checks how the pods find each other and who starts the
// cluster: each StatefulSet's serviceName and each seed is a headless
// Service over the pods, and of all the pods exactly one may start the
// cluster.
func checkCluster(r *rendered, pods []*pod) []error {
	var errs []error
	founders := []string{}
	for _, p := range pods {
		if p.set.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
			errs = append(errs, fmt.Errorf("%s: podManagementPolicy %q: pods wait for each other to be ready, but only a cluster makes them ready", p, p.set.Spec.PodManagementPolicy))
		}
		if svc := r.service(p.set.Spec.ServiceName); svc == nil {
			errs = append(errs, fmt.Errorf("%s: serviceName %q is no Service of this build", p, p.set.Spec.ServiceName))
		} else if err := checkPeers(svc, p); err != nil {
			errs = append(errs, fmt.Errorf("%s: serviceName: %v", p, err))
		}
		var seeds []string
		for _, v := range p.args.values["seeds"] {
			seeds = append(seeds, strings.Split(v, ",")...)
		}
		_, gossip, _ := splitHostPort(p.args.get("bind"), 7946)
		for _, seed := range seeds {
			host, port, err := splitHostPort(seed, 7946)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: --seeds %s: %v", p, seed, err))
				continue
			}
			if net.ParseIP(host) != nil {
				errs = append(errs, fmt.Errorf("%s: --seeds %s: a pod's IP changes when it is recreated; name the headless Service", p, seed))
				continue
			}
			svc := r.service(firstLabel(host))
			if svc == nil {
				errs = append(errs, fmt.Errorf("%s: --seeds %s: no Service %s in this build", p, seed, firstLabel(host)))
				continue
			}
			if err := checkPeers(svc, p); err != nil {
				errs = append(errs, fmt.Errorf("%s: --seeds %s: %v", p, seed, err))
			}
			if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool {
				cp, ok := p.containerPort(targetPort(sp), sp.Protocol)
				return sp.Port == port && ok && cp.ContainerPort == gossip
			}) {
				errs = append(errs, fmt.Errorf("%s: --seeds %s: Service %s has no port %d to the pods' gossip port %d", p, seed, svc.Name, port, gossip))
			}
		}
		for i := range replicas(p.set) {
			host := fmt.Sprintf("%s-%d", p.set.Name, i)
			founder := p.args.get("founder")
			if len(seeds) == 0 || (founder == "first-ordinal" && i == 0) || founder == host {
				founders = append(founders, host)
			}
		}
	}
	if len(pods) > 0 && len(founders) != 1 {
		errs = append(errs, fmt.Errorf("pods that start a cluster when no seed answers: %q; exactly one must, or pods started at once form several clusters", founders))
	}
	return errs
}

func replicas(set *appsv1.StatefulSet) int {
	if set.Spec.Replicas == nil {
		return 1
	}
	return int(*set.Spec.Replicas)
}

// targetPort is where a Service port sends: its targetPort, or its port.
func targetPort(sp corev1.ServicePort) intstr.IntOrString {
	if sp.TargetPort.Type == intstr.String || sp.TargetPort.IntVal != 0 {
		return sp.TargetPort
	}
	return intstr.FromInt32(sp.Port)
}

// checkServices checks that every Service selects dpnode pods and sends to
// ports they open, and that a Service annotated for Prometheus points it
// at a port that serves /metrics.
func checkServices(r *rendered, pods []*pod) []error {
	var errs []error
	for _, svc := range r.services {
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		var selected []*pod
		for _, p := range pods {
			if p.selectedBy(sel) {
				selected = append(selected, p)
			}
		}
		if len(selected) == 0 {
			errs = append(errs, fmt.Errorf("Service %s selects no pod of this build", svc.Name))
		}
		for _, sp := range svc.Spec.Ports {
			target := targetPort(sp)
			for _, p := range selected {
				if _, ok := p.containerPort(target, sp.Protocol); !ok {
					errs = append(errs, fmt.Errorf("Service %s port %s: %s has no %s port %s", svc.Name, sp.Name, p, cmp.Or(sp.Protocol, corev1.ProtocolTCP), target.String()))
				}
			}
		}
		if svc.Annotations["prometheus.io/scrape"] != "true" {
			continue
		}
		if path := svc.Annotations["prometheus.io/path"]; path != "/metrics" {
			errs = append(errs, fmt.Errorf("Service %s: prometheus.io/path %q, not /metrics", svc.Name, path))
		}
		port, err := strconv.Atoi(svc.Annotations["prometheus.io/port"])
		if err != nil {
			errs = append(errs, fmt.Errorf("Service %s: prometheus.io/port %q is not a port number", svc.Name, svc.Annotations["prometheus.io/port"]))
			continue
		}
		for _, p := range selected {
			if !p.httpPort(intstr.FromInt(port)) {
				errs = append(errs, fmt.Errorf("Service %s: prometheus.io/port %d is not where %s serves /metrics", svc.Name, port, p))
			}
		}
	}
	return errs
}

// checkBudgets checks that each PodDisruptionBudget covers dpnode pods.
func checkBudgets(r *rendered, pods []*pod) []error {
	var errs []error
	for _, b := range r.budgets {
		if b.Spec.MaxUnavailable == nil && b.Spec.MinAvailable == nil {
			errs = append(errs, fmt.Errorf("PodDisruptionBudget %s sets neither maxUnavailable nor minAvailable", b.Name))
		}
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil {
			errs = append(errs, fmt.Errorf("PodDisruptionBudget %s: %v", b.Name, err))
			continue
		}
		if !slices.ContainsFunc(pods, func(p *pod) bool { return p.selectedBy(sel) }) {
			errs = append(errs, fmt.Errorf("PodDisruptionBudget %s selects no pod of this build", b.Name))
		}
	}
	return errs
}

// checkServiceMonitors checks that each ServiceMonitor selects a Service
// of the build by a port that Service has, and scrapes /metrics there.
func checkServiceMonitors(r *rendered, pods []*pod) []error {
	var errs []error
	for _, sm := range r.serviceMonitors {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			errs = append(errs, fmt.Errorf("ServiceMonitor %s: %v", sm.Name, err))
			continue
		}
		var services []*corev1.Service
		for _, svc := range r.services {
			if !sel.Empty() && sel.Matches(labels.Set(svc.Labels)) {
				services = append(services, svc)
			}
		}
		if len(services) == 0 {
			errs = append(errs, fmt.Errorf("ServiceMonitor %s selects no Service of this build", sm.Name))
		}
		if len(sm.Spec.Endpoints) == 0 {
			errs = append(errs, fmt.Errorf("ServiceMonitor %s has no endpoints", sm.Name))
		}
		for _, ep := range sm.Spec.Endpoints {
			errs = append(errs, checkEndpoint(sm, ep, services, pods)...)
		}
	}
	return errs
}

func checkEndpoint(sm *monitoringv1.ServiceMonitor, ep monitoringv1.Endpoint, services []*corev1.Service, pods []*pod) []error {
	var errs []error
	if ep.Path != "" && ep.Path != "/metrics" {
		errs = append(errs, fmt.Errorf("ServiceMonitor %s: path %q, not /metrics", sm.Name, ep.Path))
	}
	if ep.Port == "" {
		return append(errs, fmt.Errorf("ServiceMonitor %s: an endpoint without a port name", sm.Name))
	}
	for _, svc := range services {
		i := slices.IndexFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == ep.Port })
		if i < 0 {
			errs = append(errs, fmt.Errorf("ServiceMonitor %s: Service %s has no port named %s", sm.Name, svc.Name, ep.Port))
			continue
		}
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		for _, p := range pods {
			if p.selectedBy(sel) && !p.httpPort(targetPort(svc.Spec.Ports[i])) {
				errs = append(errs, fmt.Errorf("ServiceMonitor %s: port %s of Service %s is not where %s serves /metrics", sm.Name, ep.Port, svc.Name, p))
			}
		}
	}
	return errs
}
