package kubernetes

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// newObject returns an empty object of the API type of apiVersion and
// kind. A kind without a type here fails the build that holds it: add its
// type rather than let an object pass unchecked.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "v1 Secret":
		return &corev1.Secret{}, true
	case "v1 PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, true
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, true
	}
	return nil, false
}

// rendered is what one kustomization builds, each object decoded into its
// API type.
type rendered struct {
	statefulSets    []*appsv1.StatefulSet
	services        []*corev1.Service
	secrets         []*corev1.Secret
	claims          []*corev1.PersistentVolumeClaim
	budgets         []*policyv1.PodDisruptionBudget
	serviceMonitors []*monitoringv1.ServiceMonitor
}

// render builds the kustomization in dir, as kubectl apply -k or kustomize
// build would, and decodes every object strictly: a field that its API type
// does not have (a misspelling, a field at the wrong level) is an error,
// where the API server would drop it, or kubectl refuse the whole apply.
func render(dir string) (*rendered, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	r := &rendered{}
	for _, res := range rm.Resources() {
		id := fmt.Sprintf("%s %s", res.GetKind(), res.GetName())
		obj, ok := newObject(res.GetApiVersion(), res.GetKind())
		if !ok {
			return nil, fmt.Errorf("%s: no API type of %s %s to check it with", id, res.GetApiVersion(), res.GetKind())
		}
		b, err := res.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		if err := yaml.UnmarshalStrict(b, obj); err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		switch o := obj.(type) {
		case *appsv1.StatefulSet:
			r.statefulSets = append(r.statefulSets, o)
		case *corev1.Service:
			r.services = append(r.services, o)
		case *corev1.Secret:
			r.secrets = append(r.secrets, o)
		case *corev1.PersistentVolumeClaim:
			r.claims = append(r.claims, o)
		case *policyv1.PodDisruptionBudget:
			r.budgets = append(r.budgets, o)
		case *monitoringv1.ServiceMonitor:
			r.serviceMonitors = append(r.serviceMonitors, o)
		}
	}
	return r, nil
}

// kustomizations finds every kustomization under root: the directories
// kubectl apply -k takes (base, overlays, the Secrets' example), and the
// components, which only a kustomization can use.
func kustomizations(root string) (builds, components []string, err error) {
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() != "kustomization.yaml" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(b, &head); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		switch head.Kind {
		case "", "Kustomization":
			builds = append(builds, dir)
		case "Component":
			components = append(components, dir)
		default:
			return fmt.Errorf("%s: kind %q is neither a Kustomization nor a Component", path, head.Kind)
		}
		return nil
	})
	return builds, components, err
}

// Components by what they choose: one mode, one engine, and whether to be
// scraped by the Prometheus Operator. A mode comes first, so that an
// engine's patches reach the StatefulSets the mode adds. A component under
// components/ that none of these names fails TestKubernetes: add it here.
var (
	modeComponents    = []string{"", "components/internal"}
	engineComponents  = []string{"", "components/sim", "components/llamacpp"}
	monitorComponents = []string{"", "components/servicemonitor"}
)

// composition is a kustomization of the base with some components, as a
// user's own overlay would combine them.
type composition []string

func (c composition) name() string { return "base+" + strings.Join(c, "+") }

// compositions lists every combination of the components on the base,
// but none: that is the base itself.
func compositions() []composition {
	var all []composition
	for _, mode := range modeComponents {
		for _, engine := range engineComponents {
			for _, monitor := range monitorComponents {
				var c composition
				for _, part := range []string{mode, engine, monitor} {
					if part != "" {
						c = append(c, part)
					}
				}
				if len(c) > 0 {
					all = append(all, c)
				}
			}
		}
	}
	return all
}

// writeComposition writes c as a kustomization in dir, naming the base
// and the components by their path from dir (kustomize takes no absolute
// ones).
func writeComposition(dir, root string, c composition) error {
	rel, err := filepath.Rel(dir, root)
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\n", filepath.Join(rel, "base"))
	if len(c) > 0 {
		b.WriteString("components:\n")
		for _, part := range c {
			fmt.Fprintf(&b, "- %s\n", filepath.Join(rel, part))
		}
	}
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644)
}

// composedComponents are the components that compositions use.
func composedComponents() []string {
	var all []string
	for _, list := range [][]string{modeComponents, engineComponents, monitorComponents} {
		for _, c := range list {
			if c != "" {
				if len(c) > 0 {
					all = append(all, c)
				}
			}
		}
	}
	slices.Sort(all)
	return all
}
