// Command goclient is a foreign client: a current client-go / controller-runtime program, built
// from the Go module proxy, that runs unchanged against the Kubernetes API under test (the
// runnerscale emulator or a real control plane). It uses what real controllers use: informers
// that sync through WatchList, protobuf bodies for built-in kinds (controller-runtime's default,
// and the clientset's), protobuf DeleteOptions, merge and strategic merge patches, status
// writes, and unstructured access to the runnerscale CRDs. Every answer is checked; the first
// wrong one ends the run with exit status 1 and a message that names the check.
//
// Usage: goclient -kubeconfig PATH -namespace NS [-timeout 240s]
// The namespace must exist; the runnerscale CRDs (deploy/crds) must be installed.
// With -in-cluster it runs as a pod instead (see incluster.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

const protobuf = "application/vnd.kubernetes.protobuf"

var ersGVK = schema.GroupVersionKind{Group: "actions.github.com", Version: "v1alpha1", Kind: "EphemeralRunnerSet"}

// failure ends the run: one line naming the check and what was wrong.
type failure struct{ msg string }

func fail(format string, args ...any) { panic(failure{fmt.Sprintf(format, args...)}) }

func must(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

// request is what the recorder saw of one HTTP request.
type request struct {
	method, path, query, contentType, accept string
}

// recorder wraps the client's transport and remembers every request, so the run can assert
// that the wire format really was protobuf and that informers really used WatchList.
type recorder struct {
	mu       sync.Mutex
	requests []request
	next     http.RoundTripper
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.requests = append(r.requests, request{
		req.Method, req.URL.Path, req.URL.RawQuery, req.Header.Get("Content-Type"), req.Header.Get("Accept"),
	})
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

func (r *recorder) matching(pred func(request) bool) []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []request
	for _, q := range r.requests {
		if pred(q) {
			out = append(out, q)
		}
	}
	return out
}

type run struct {
	ctx       context.Context
	ns        string
	rec       *recorder
	cl        client.Client
	clientset *kubernetes.Clientset
	cache     cache.Cache
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the API under test")
	namespace := flag.String("namespace", "", "an existing namespace to work in")
	timeout := flag.Duration("timeout", 240*time.Second, "deadline for the whole run")
	inCluster := flag.Bool("in-cluster", false, "run as a pod: connect with the service account, record success")
	flag.Parse()
	if *inCluster {
		if err := runInCluster(*timeout); err != nil {
			fmt.Printf("FAIL in-cluster: %v\n", err)
			os.Exit(1)
		}
		fmt.Println("PASS")
		return
	}
	if *kubeconfig == "" || *namespace == "" {
		fmt.Fprintln(os.Stderr, "usage: goclient -kubeconfig PATH -namespace NS [-timeout 240s] | goclient -in-cluster")
		os.Exit(2)
	}
	ctrllog.SetLogger(klog.NewKlogr())
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	current := "setup"
	defer func() {
		if p := recover(); p != nil {
			if f, ok := p.(failure); ok {
				fmt.Printf("FAIL %s: %s\n", current, f.msg)
				os.Exit(1)
			}
			panic(p)
		}
	}()

	r := setup(ctx, *kubeconfig, *namespace)
	steps := []struct {
		name string
		fn   func(*run)
	}{
		{"informers sync through WatchList", (*run).informersSyncThroughWatchList},
		{"protobuf creates of built-in kinds", (*run).protobufCreates},
		{"gets, lists and the cache agree", (*run).getsAndLists},
		{"merge and strategic merge patches", (*run).patches},
		{"status writes are validated", (*run).statusWrites},
		{"priority class admission", (*run).priorityAdmission},
		{"deletes with protobuf DeleteOptions", (*run).deletes},
	}
	for _, s := range steps {
		current = s.name
		s.fn(r)
		fmt.Printf("ok   %s\n", s.name)
	}
	fmt.Println("PASS")
}

func setup(ctx context.Context, kubeconfig, ns string) *run {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	must(err, "load kubeconfig")
	cfg.Timeout = 30 * time.Second
	rec := &recorder{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { rec.next = rt; return rec })
	scheme := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(scheme), "scheme")
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	must(err, "controller-runtime client")
	clientset, err := kubernetes.NewForConfig(cfg)
	must(err, "clientset")
	c, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	must(err, "cache")
	return &run{ctx: ctx, ns: ns, rec: rec, cl: cl, clientset: clientset, cache: c}
}

func (r *run) key(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: r.ns, Name: name}
}

func ers() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(ersGVK)
	return u
}

// eventually polls cond until it holds or 30 s pass (a cache converges asynchronously).
func (r *run) eventually(what string, cond func() (bool, error)) {
	err := wait.PollUntilContextTimeout(r.ctx, 50*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond() })
	if err != nil {
		fail("%s: %v", what, err)
	}
}

// --- informers ----------------------------------------------------------------------------------

var watched = []client.Object{
	&corev1.ConfigMap{}, &corev1.Secret{}, &corev1.Pod{}, &corev1.ServiceAccount{},
	&coordinationv1.Lease{}, &eventsv1.Event{},
}

func (r *run) informersSyncThroughWatchList() {
	seed := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "seed", Namespace: r.ns, Labels: map[string]string{"goclient": "yes"}},
		Data:       map[string]string{"k": "v"},
	}
	must(r.cl.Create(r.ctx, seed), "create the seed ConfigMap")
	for _, obj := range append(watched, ers()) {
		_, err := r.cache.GetInformer(r.ctx, obj)
		must(err, fmt.Sprintf("informer for %T", obj))
	}
	go func() {
		if err := r.cache.Start(r.ctx); err != nil {
			fmt.Fprintf(os.Stderr, "cache stopped: %v\n", err)
		}
	}()
	syncCtx, cancel := context.WithTimeout(r.ctx, 60*time.Second)
	defer cancel()
	if !r.cache.WaitForCacheSync(syncCtx) {
		fail("the informer caches did not sync within 60 s (no initial-events-end bookmark?)")
	}
	for _, plural := range []string{"configmaps", "secrets", "pods", "serviceaccounts", "leases", "events", "ephemeralrunnersets"} {
		isResource := func(q request) bool {
			return q.method == http.MethodGet && strings.HasSuffix(q.path, "/namespaces/"+r.ns+"/"+plural)
		}
		streams := r.rec.matching(func(q request) bool {
			return isResource(q) && strings.Contains(q.query, "sendInitialEvents=true") &&
				strings.Contains(q.query, "resourceVersionMatch=NotOlderThan") && strings.Contains(q.query, "watch=true")
		})
		lists := r.rec.matching(func(q request) bool { return isResource(q) && !strings.Contains(q.query, "watch=") })
		if len(streams) == 0 {
			fail("the %s informer never opened a WatchList stream", plural)
		}
		if len(lists) > 0 {
			fail("the %s informer fell back to LIST (%s): the WatchList stream was not accepted", plural, lists[0].query)
		}
	}
	var cached corev1.ConfigMap
	must(r.cache.Get(r.ctx, r.key("seed"), &cached), "the seed ConfigMap from the synced cache")
	if cached.Data["k"] != "v" {
		fail("cached seed ConfigMap has data %v", cached.Data)
	}
}

// --- creates ------------------------------------------------------------------------------------

func (r *run) protobufCreates() {
	now := metav1.NewMicroTime(time.Now().UTC().Truncate(time.Microsecond))
	objs := []client.Object{
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: r.ns, Labels: map[string]string{"goclient": "yes"},
				Annotations: map[string]string{"example.com/note": "protobuf"}},
			Data:       map[string]string{"a": "1"},
			BinaryData: map[string][]byte{"bin": {0, 1, 2, 255}},
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "secret", Namespace: r.ns},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"token": []byte("s3cr3t")},
		},
		&corev1.ServiceAccount{
			ObjectMeta:                   metav1.ObjectMeta{Name: "runner", Namespace: r.ns},
			AutomountServiceAccountToken: ptr.To(false),
		},
		&coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "lease", Namespace: r.ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("goclient"), LeaseDurationSeconds: ptr.To[int32](15),
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr.To[int32](0)},
		},
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "pod", Namespace: r.ns, Labels: map[string]string{"app": "goclient"}},
			Spec: corev1.PodSpec{
				RestartPolicy:                 corev1.RestartPolicyNever,
				TerminationGracePeriodSeconds: ptr.To[int64](5),
				Containers: []corev1.Container{{
					Name: "main", Image: "busybox:1.36", Command: []string{"sleep", "3600"},
					Env:   []corev1.EnvVar{{Name: "MODE", Value: "test"}},
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"),
							corev1.ResourceMemory: resource.MustParse("1024Mi")},
						Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
					},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}},
						PeriodSeconds: 5,
					},
				}},
			},
		},
	}
	for _, obj := range objs {
		must(r.cl.Create(r.ctx, obj), fmt.Sprintf("create %T", obj))
	}
	// An Event about the ConfigMap, as a controller's recorder writes it (events.k8s.io/v1).
	var cm corev1.ConfigMap
	must(r.cl.Get(r.ctx, r.key("cm"), &cm), "get cm")
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "cm.goclient", Namespace: r.ns},
		EventTime:  now, ReportingController: "runnerscale.dev/goclient", ReportingInstance: "goclient-1",
		Action: "Check", Reason: "Checked", Note: "checked over protobuf", Type: corev1.EventTypeNormal,
		Regarding: corev1.ObjectReference{Kind: "ConfigMap", APIVersion: "v1", Namespace: r.ns, Name: "cm", UID: cm.UID},
	}
	must(r.cl.Create(r.ctx, ev), "create events.k8s.io/v1 Event")
	// The typed clientset prefers protobuf too.
	_, err := r.clientset.CoreV1().ConfigMaps(r.ns).Create(r.ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "cm-typed", Namespace: r.ns, Labels: map[string]string{"goclient": "yes"}},
		Data:       map[string]string{"b": "2"},
	}, metav1.CreateOptions{})
	must(err, "clientset create ConfigMap")

	posts := r.rec.matching(func(q request) bool { return q.method == http.MethodPost })
	for _, q := range posts {
		if !strings.HasPrefix(q.contentType, protobuf) {
			fail("POST %s was sent as %q, not protobuf", q.path, q.contentType)
		}
	}
	if len(posts) < len(objs)+2 {
		fail("expected %d protobuf POSTs, saw %d", len(objs)+2, len(posts))
	}
	// Why JSON responses are enough: every request (protobuf or not) also accepts JSON.
	for _, q := range r.rec.matching(func(request) bool { return true }) {
		if q.accept != "" && !strings.Contains(q.accept, "json") && !strings.Contains(q.accept, "*/*") {
			fail("%s %s accepts only %q: a JSON answer would not do", q.method, q.path, q.accept)
		}
	}

	// What came back is what was sent, in the server's canonical form.
	var secret corev1.Secret
	must(r.cl.Get(r.ctx, r.key("secret"), &secret), "get secret")
	if string(secret.Data["token"]) != "s3cr3t" || secret.Type != corev1.SecretTypeOpaque {
		fail("secret round trip: %v %q", secret.Data, secret.Type)
	}
	must(r.cl.Get(r.ctx, r.key("cm"), &cm), "get cm")
	if cm.Data["a"] != "1" || string(cm.BinaryData["bin"]) != string([]byte{0, 1, 2, 255}) || cm.Annotations["example.com/note"] != "protobuf" {
		fail("configmap round trip: %v %v %v", cm.Data, cm.BinaryData, cm.Annotations)
	}
	var lease coordinationv1.Lease
	must(r.cl.Get(r.ctx, r.key("lease"), &lease), "get lease")
	if lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.Equal(&now) || *lease.Spec.HolderIdentity != "goclient" ||
		*lease.Spec.LeaseDurationSeconds != 15 {
		fail("lease round trip: renewTime %v (sent %v), holder %v", lease.Spec.RenewTime, now, lease.Spec.HolderIdentity)
	}
	var pod corev1.Pod
	must(r.cl.Get(r.ctx, r.key("pod"), &pod), "get pod")
	c := pod.Spec.Containers[0]
	if mem := c.Resources.Requests[corev1.ResourceMemory]; mem.String() != "1Gi" {
		fail("pod memory request %q, want the canonical 1Gi", mem.String())
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Port.StrVal != "http" ||
		c.Ports[0].ContainerPort != 8080 || c.Env[0].Value != "test" || c.Command[1] != "3600" {
		fail("pod container round trip: %+v", c)
	}
	if pod.Spec.Priority == nil || *pod.Spec.Priority != 0 || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		fail("pod defaults: priority %v restartPolicy %q", pod.Spec.Priority, pod.Spec.RestartPolicy)
	}
	var sa corev1.ServiceAccount
	must(r.cl.Get(r.ctx, r.key("runner"), &sa), "get serviceaccount")
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		fail("serviceaccount automountServiceAccountToken %v, want false", sa.AutomountServiceAccountToken)
	}
	var gotEv eventsv1.Event
	must(r.cl.Get(r.ctx, r.key("cm.goclient"), &gotEv), "get event")
	if gotEv.Regarding.UID != cm.UID || gotEv.Note != "checked over protobuf" || !gotEv.EventTime.Equal(&now) {
		fail("event round trip: %+v", gotEv)
	}
}

// --- reads ---------------------------------------------------------------------------------------

func (r *run) getsAndLists() {
	var list corev1.ConfigMapList
	must(r.cl.List(r.ctx, &list, client.InNamespace(r.ns), client.MatchingLabels{"goclient": "yes"}), "list ConfigMaps")
	names := map[string]bool{}
	for _, cm := range list.Items {
		names[cm.Name] = true
	}
	if len(list.Items) != 3 || !names["seed"] || !names["cm"] || !names["cm-typed"] {
		fail("labelled ConfigMaps: %v", names)
	}
	for _, obj := range []client.Object{&corev1.ConfigMap{}, &corev1.Secret{}, &corev1.Pod{}, &corev1.ServiceAccount{}, &coordinationv1.Lease{}, &eventsv1.Event{}} {
		name := map[string]string{"*v1.ConfigMap": "cm", "*v1.Secret": "secret", "*v1.Pod": "pod",
			"*v1.ServiceAccount": "runner", "*v1.Lease": "lease", "*v1.Event": "cm.goclient"}[fmt.Sprintf("%T", obj)]
		fresh := obj.DeepCopyObject().(client.Object)
		must(r.cl.Get(r.ctx, r.key(name), fresh), "get "+name)
		r.eventually(fmt.Sprintf("the cache to hold %T %s at resourceVersion %s", obj, name, fresh.GetResourceVersion()), func() (bool, error) {
			cached := obj.DeepCopyObject().(client.Object)
			if err := r.cache.Get(r.ctx, r.key(name), cached); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return cached.GetResourceVersion() == fresh.GetResourceVersion(), nil
		})
	}
	_, err := r.clientset.CoreV1().ConfigMaps(r.ns).Get(r.ctx, "no-such-configmap", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		fail("get of a missing ConfigMap: %v, want NotFound", err)
	}
}

// --- patches -------------------------------------------------------------------------------------

func (r *run) patches() {
	var cm corev1.ConfigMap
	must(r.cl.Get(r.ctx, r.key("cm"), &cm), "get cm")
	orig := cm.DeepCopy()
	cm.Data["a"] = "2"
	cm.Data["new"] = "x"
	cm.Labels["patched"] = "merge"
	must(r.cl.Patch(r.ctx, &cm, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})), "merge patch cm")
	if cm.Data["a"] != "2" || cm.Data["new"] != "x" || cm.Labels["patched"] != "merge" || cm.Labels["goclient"] != "yes" {
		fail("merge patch result: %v %v", cm.Data, cm.Labels)
	}
	stale := orig.DeepCopy()
	stale.Data["a"] = "3"
	err := r.cl.Patch(r.ctx, stale, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	if !apierrors.IsConflict(err) {
		fail("merge patch carrying a stale resourceVersion: %v, want Conflict", err)
	}

	var pod corev1.Pod
	must(r.cl.Get(r.ctx, r.key("pod"), &pod), "get pod")
	before := pod.DeepCopy()
	pod.Spec.Containers[0].Image = "busybox:1.37"
	pod.Labels["patched"] = "strategic"
	pod.Finalizers = append(pod.Finalizers, "example.com/goclient")
	must(r.cl.Patch(r.ctx, &pod, client.StrategicMergeFrom(before)), "strategic merge patch pod")
	c := pod.Spec.Containers[0]
	if c.Image != "busybox:1.37" || c.Name != "main" || c.Command[0] != "sleep" || pod.Labels["app"] != "goclient" ||
		pod.Labels["patched"] != "strategic" || len(pod.Finalizers) != 1 {
		fail("strategic merge patch result: image %q labels %v finalizers %v", c.Image, pod.Labels, pod.Finalizers)
	}
	r.eventually("the cache to see the patched image", func() (bool, error) {
		var cached corev1.Pod
		if err := r.cache.Get(r.ctx, r.key("pod"), &cached); err != nil {
			return false, err
		}
		return cached.Spec.Containers[0].Image == "busybox:1.37", nil
	})

	var lease coordinationv1.Lease
	must(r.cl.Get(r.ctx, r.key("lease"), &lease), "get lease")
	renewed := lease.DeepCopy()
	later := metav1.NewMicroTime(lease.Spec.RenewTime.Add(1500 * time.Millisecond))
	renewed.Spec.RenewTime = &later
	must(r.cl.Update(r.ctx, renewed), "update lease (protobuf PUT)")
	if !renewed.Spec.RenewTime.Equal(&later) || renewed.ResourceVersion == lease.ResourceVersion {
		fail("lease update: renewTime %v, resourceVersion %s → %s", renewed.Spec.RenewTime, lease.ResourceVersion, renewed.ResourceVersion)
	}
	puts := r.rec.matching(func(q request) bool { return q.method == http.MethodPut })
	if len(puts) == 0 || !strings.HasPrefix(puts[len(puts)-1].contentType, protobuf) {
		fail("the lease update was not sent as protobuf: %+v", puts)
	}
}

// --- status ---------------------------------------------------------------------------------------

func (r *run) statusWrites() {
	var pod corev1.Pod
	must(r.cl.Get(r.ctx, r.key("pod"), &pod), "get pod")
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
		Type: "example.com/checked", Status: corev1.ConditionTrue, Reason: "GoClient",
		LastTransitionTime: metav1.NewTime(time.Now().Truncate(time.Second)),
	})
	must(r.cl.Status().Update(r.ctx, &pod), "pod status update (protobuf PUT)")
	found := false
	for _, c := range pod.Status.Conditions {
		found = found || (c.Type == "example.com/checked" && c.Reason == "GoClient")
	}
	if !found || pod.Spec.Containers[0].Image != "busybox:1.37" {
		fail("pod status update lost the condition or the spec: %+v", pod.Status.Conditions)
	}

	set := ers()
	set.SetName("set")
	set.SetNamespace(r.ns)
	set.Object["spec"] = map[string]any{
		"replicas": int64(1),
		"patchID":  int64(0),
		"ephemeralRunnerSpec": map[string]any{
			"githubConfigUrl": "https://github.com/example", "githubConfigSecret": "secret", "runnerScaleSetId": int64(1),
			"spec": map[string]any{"containers": []any{map[string]any{"name": "runner", "image": "runner:1"}}},
		},
	}
	must(r.cl.Create(r.ctx, set), "create EphemeralRunnerSet")
	good := client.RawPatch(types.MergePatchType, []byte(`{"status":{"currentReplicas":3,"phase":"Running"}}`))
	must(r.cl.Status().Patch(r.ctx, set, good), "valid EphemeralRunnerSet status patch")
	if got, _, _ := unstructured.NestedInt64(set.Object, "status", "currentReplicas"); got != 3 {
		fail("status.currentReplicas after patch: %v", set.Object["status"])
	}
	bad := client.RawPatch(types.MergePatchType, []byte(`{"status":{"currentReplicas":"abc"}}`))
	probe := ers()
	probe.SetName("set")
	probe.SetNamespace(r.ns)
	err := r.cl.Status().Patch(r.ctx, probe, bad)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.currentReplicas") {
		fail("status patch with currentReplicas \"abc\": %v, want 422 Invalid naming status.currentReplicas", err)
	}
	spec := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":2}}`))
	must(r.cl.Patch(r.ctx, set, spec), "spec patch after the rejected status write")
	replicas, _, _ := unstructured.NestedInt64(set.Object, "spec", "replicas")
	current, _, _ := unstructured.NestedInt64(set.Object, "status", "currentReplicas")
	if replicas != 2 || current != 3 || set.GetGeneration() != 2 {
		fail("after the spec patch: replicas %d, status.currentReplicas %d, generation %d", replicas, current, set.GetGeneration())
	}
	r.eventually("the EphemeralRunnerSet informer to see generation 2", func() (bool, error) {
		cached := ers()
		if err := r.cache.Get(r.ctx, r.key("set"), cached); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cached.GetGeneration() == 2, nil
	})
}

// --- admission --------------------------------------------------------------------------------------

func (r *run) priorityAdmission() {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "unschedulable", Namespace: r.ns},
		Spec: corev1.PodSpec{
			PriorityClassName: "runnerscale-goclient-missing",
			Containers:        []corev1.Container{{Name: "main", Image: "busybox"}},
		},
	}
	err := r.cl.Create(r.ctx, pod)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "no PriorityClass with name runnerscale-goclient-missing was found") {
		fail("pod with an unknown priorityClassName: %v, want 403 Forbidden", err)
	}
	critical := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "critical", Namespace: r.ns},
		Spec: corev1.PodSpec{
			PriorityClassName: "system-cluster-critical",
			Containers:        []corev1.Container{{Name: "main", Image: "busybox"}},
		},
	}
	must(r.cl.Create(r.ctx, critical), "pod with priorityClassName system-cluster-critical")
	if critical.Spec.Priority == nil || *critical.Spec.Priority != 2000000000 {
		fail("system-cluster-critical pod priority %v", critical.Spec.Priority)
	}
}

// --- deletes ------------------------------------------------------------------------------------------

func (r *run) deletes() {
	var cm corev1.ConfigMap
	must(r.cl.Get(r.ctx, r.key("cm"), &cm), "get cm")
	wrong := types.UID("00000000-0000-0000-0000-000000000000")
	err := r.cl.Delete(r.ctx, &cm, client.Preconditions{UID: &wrong})
	if !apierrors.IsConflict(err) {
		fail("delete with a wrong UID precondition: %v, want 409 Conflict (were the DeleteOptions read?)", err)
	}
	err = r.clientset.CoreV1().Secrets(r.ns).Delete(r.ctx, "secret", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	must(err, "dry-run delete of the secret")
	var secret corev1.Secret
	must(r.cl.Get(r.ctx, r.key("secret"), &secret), "the secret after a dry-run delete")

	must(r.cl.Delete(r.ctx, &cm, client.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion},
		client.PropagationPolicy(metav1.DeletePropagationBackground)), "delete cm with matching preconditions")
	must(r.cl.Delete(r.ctx, &secret), "delete secret")
	var pod corev1.Pod
	must(r.cl.Get(r.ctx, r.key("pod"), &pod), "get pod")
	must(r.cl.Delete(r.ctx, &pod, client.GracePeriodSeconds(0)), "delete pod")
	// The pod carries a finalizer: it stays, marked for deletion, until the finalizer goes.
	must(r.cl.Get(r.ctx, r.key("pod"), &pod), "get the deleting pod")
	if pod.DeletionTimestamp == nil {
		fail("pod with a finalizer has no deletionTimestamp after delete")
	}
	before := pod.DeepCopy()
	pod.Finalizers = nil
	must(r.cl.Patch(r.ctx, &pod, client.MergeFrom(before)), "remove the pod's finalizer")
	for _, gone := range []client.Object{&corev1.ConfigMap{}, &corev1.Secret{}, &corev1.Pod{}} {
		name := map[string]string{"*v1.ConfigMap": "cm", "*v1.Secret": "secret", "*v1.Pod": "pod"}[fmt.Sprintf("%T", gone)]
		r.eventually(fmt.Sprintf("%s to be gone from the server and the cache", name), func() (bool, error) {
			errServer := r.cl.Get(r.ctx, r.key(name), gone.DeepCopyObject().(client.Object))
			errCache := r.cache.Get(r.ctx, r.key(name), gone.DeepCopyObject().(client.Object))
			return apierrors.IsNotFound(errServer) && apierrors.IsNotFound(errCache), nil
		})
	}
	deletes := r.rec.matching(func(q request) bool { return q.method == http.MethodDelete })
	for _, q := range deletes {
		if !strings.HasPrefix(q.contentType, protobuf) {
			fail("DELETE %s carried DeleteOptions as %q, not protobuf", q.path, q.contentType)
		}
	}
	if len(deletes) < 5 {
		fail("expected at least 5 DELETEs, saw %d", len(deletes))
	}
}
