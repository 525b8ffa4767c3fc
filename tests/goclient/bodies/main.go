// Command bodies prints request bodies for one object of every built-in kind the emulator
// serves, each in JSON and in protobuf, as encoded by apimachinery's own serializers. The
// protobuf test creates each both ways (dry run) and expects the same answer: the emulator's
// protobuf decoding must agree with its JSON decoding, as the real server's does.
//
// Output: one JSON object per line: {"kind", "path", "json", "protobuf" (base64)}.
// Usage: bodies -namespace NS -name-suffix SUFFIX
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

type body struct {
	Kind     string          `json:"kind"`
	Path     string          `json:"path"`
	JSON     json.RawMessage `json:"json"`
	Protobuf string          `json:"protobuf"`
}

func main() {
	ns := flag.String("namespace", "default", "namespace of the namespaced objects")
	suffix := flag.String("name-suffix", "x", "suffix of cluster-scoped names")
	flag.Parse()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := apiextv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	pb := protobuf.NewSerializer(scheme, scheme)
	at := time.Date(2026, 5, 4, 3, 2, 1, 123456000, time.UTC)
	micro := metav1.NewMicroTime(at)
	coreNS := "/api/v1/namespaces/" + *ns + "/"
	objects := []struct {
		path string
		obj  runtime.Object
		gvk  schema.GroupVersionKind
	}{
		{"/api/v1/namespaces", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pb-ns-" + *suffix,
			Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"example.com/a": "b"}}},
			corev1.SchemeGroupVersion.WithKind("Namespace")},
		{coreNS + "configmaps", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Labels: map[string]string{"a": "b"}},
			Data: map[string]string{"k": "v", "empty": ""}, BinaryData: map[string][]byte{"b": {0, 255}}, Immutable: ptr.To(false)},
			corev1.SchemeGroupVersion.WithKind("ConfigMap")},
		{coreNS + "secrets", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "secret"}, Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"token": []byte("s3cr3t")}, StringData: map[string]string{"extra": "plain"}, Immutable: ptr.To(true)},
			corev1.SchemeGroupVersion.WithKind("Secret")},
		{coreNS + "serviceaccounts", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa"},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry"}}, AutomountServiceAccountToken: ptr.To(false)},
			corev1.SchemeGroupVersion.WithKind("ServiceAccount")},
		{coreNS + "pods", pod(), corev1.SchemeGroupVersion.WithKind("Pod")},
		{coreNS + "events", &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "ev"},
			InvolvedObject: corev1.ObjectReference{Kind: "ConfigMap", Namespace: *ns, Name: "cm", APIVersion: "v1"},
			Reason:         "Checked", Message: "core event", Type: corev1.EventTypeNormal, Count: 2,
			Source:         corev1.EventSource{Component: "goclient"},
			FirstTimestamp: metav1.NewTime(at.Truncate(time.Second)), LastTimestamp: metav1.NewTime(at.Truncate(time.Second)),
			ReportingController: "runnerscale.dev/goclient", ReportingInstance: "i-1"},
			corev1.SchemeGroupVersion.WithKind("Event")},
		{"/apis/events.k8s.io/v1/namespaces/" + *ns + "/events", &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "ev2"},
			EventTime: micro, ReportingController: "runnerscale.dev/goclient", ReportingInstance: "i-1", Action: "Check",
			Reason: "Checked", Note: "events.k8s.io event", Type: corev1.EventTypeWarning,
			Series:    &eventsv1.EventSeries{Count: 3, LastObservedTime: micro},
			Regarding: corev1.ObjectReference{Kind: "ConfigMap", Namespace: *ns, Name: "cm", APIVersion: "v1"}},
			eventsv1.SchemeGroupVersion.WithKind("Event")},
		{"/apis/rbac.authorization.k8s.io/v1/namespaces/" + *ns + "/roles", &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "role"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "pods/status"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{"actions.github.com"}, Resources: []string{"ephemeralrunners"}, ResourceNames: []string{"a"}, Verbs: []string{"*"}}}},
			rbacv1.SchemeGroupVersion.WithKind("Role")},
		{"/apis/rbac.authorization.k8s.io/v1/namespaces/" + *ns + "/rolebindings", &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rb"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "sa", Namespace: *ns}},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "role"}},
			rbacv1.SchemeGroupVersion.WithKind("RoleBinding")},
		{"/apis/coordination.k8s.io/v1/namespaces/" + *ns + "/leases", &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "lease"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("me"), LeaseDurationSeconds: ptr.To[int32](15),
				AcquireTime: &micro, RenewTime: &micro, LeaseTransitions: ptr.To[int32](4)}},
			coordinationv1.SchemeGroupVersion.WithKind("Lease")},
		{"/apis/scheduling.k8s.io/v1/priorityclasses", &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "pb-pc-" + *suffix},
			Value: 42, Description: "protobuf check", PreemptionPolicy: ptr.To(corev1.PreemptNever)},
			schedulingv1.SchemeGroupVersion.WithKind("PriorityClass")},
		{"/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd(*suffix), apiextv1.SchemeGroupVersion.WithKind("CustomResourceDefinition")},
	}
	for _, o := range objects {
		o.obj.GetObjectKind().SetGroupVersionKind(o.gvk)
		j, err := json.Marshal(o.obj)
		if err != nil {
			panic(err)
		}
		var buf bytes.Buffer
		if err := pb.Encode(o.obj, &buf); err != nil {
			panic(fmt.Sprintf("%s: %v", o.gvk.Kind, err))
		}
		line, _ := json.Marshal(body{Kind: o.gvk.Kind, Path: o.path, JSON: j, Protobuf: base64.StdEncoding.EncodeToString(buf.Bytes())})
		os.Stdout.Write(append(line, '\n'))
	}
}

func pod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod", Labels: map[string]string{"app": "x"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "cm",
				UID: "11111111-2222-3333-4444-555555555555", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false)}},
			Finalizers: []string{"example.com/keep"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyOnFailure,
			TerminationGracePeriodSeconds: ptr.To[int64](7),
			ActiveDeadlineSeconds:         ptr.To[int64](600),
			NodeSelector:                  map[string]string{"kubernetes.io/os": "linux"},
			SecurityContext:               &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1001), FSGroup: ptr.To[int64](123), RunAsNonRoot: ptr.To(true)},
			Tolerations:                   []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "ci", Effect: corev1.TaintEffectNoSchedule}},
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "b"}}}}}}}},
			InitContainers: []corev1.Container{{Name: "init", Image: "busybox:1.36", Command: []string{"true"}}},
			Containers: []corev1.Container{{
				Name: "main", Image: "ghcr.io/actions/actions-runner:latest", Command: []string{"/home/runner/run.sh"}, Args: []string{"--once"},
				WorkingDir: "/home/runner",
				Env: []corev1.EnvVar{
					{Name: "PLAIN", Value: "v"},
					{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
					{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
					{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "secret"}, Key: "token", Optional: ptr.To(true)}}},
				},
				EnvFrom: []corev1.EnvFromSource{{Prefix: "CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
				Ports:   []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("512Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: "/home/runner/_work"}, {Name: "cfg", MountPath: "/etc/cfg", ReadOnly: true}},
				LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
					InitialDelaySeconds: 3, PeriodSeconds: 10, FailureThreshold: 4},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("metrics"),
					HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Check", Value: "1"}}}}},
				StartupProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/ok"}}}},
				Lifecycle:    &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 2}}},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, ReadOnlyRootFilesystem: ptr.To(true)},
				ImagePullPolicy: corev1.PullIfNotPresent,
			}},
			Volumes: []corev1.Volume{
				{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("2Gi"))}}},
				{Name: "cfg", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Items: []corev1.KeyToPath{{Key: "k", Path: "k.txt", Mode: ptr.To[int32](0o400)}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}},
				}}}},
				{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "secret", DefaultMode: ptr.To[int32](0o440)}}},
			},
		},
	}
}

func crd(suffix string) *apiextv1.CustomResourceDefinition {
	group := "pb" + suffix + ".goclient.runnerscale.dev"
	min0 := 0.0
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "probes." + group},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "probes", Singular: "probe", Kind: "Probe", ListKind: "ProbeList", ShortNames: []string{"prb"}},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Subresources:             &apiextv1.CustomResourceSubresources{Status: &apiextv1.CustomResourceSubresourceStatus{}},
				AdditionalPrinterColumns: []apiextv1.CustomResourceColumnDefinition{{Name: "Size", Type: "integer", JSONPath: ".spec.size"}},
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextv1.JSONSchemaProps{
						"spec": {
							Type:     "object",
							Required: []string{"size"},
							Properties: map[string]apiextv1.JSONSchemaProps{
								"size":  {Type: "integer", Minimum: &min0, Default: &apiextv1.JSON{Raw: []byte("1")}},
								"mode":  {Type: "string", Enum: []apiextv1.JSON{{Raw: []byte(`"A"`)}, {Raw: []byte(`"B"`)}}, Pattern: "^[AB]$"},
								"tags":  {Type: "array", Items: &apiextv1.JSONSchemaPropsOrArray{Schema: &apiextv1.JSONSchemaProps{Type: "string"}}, MaxItems: ptr.To[int64](5)},
								"extra": {Type: "object", XPreserveUnknownFields: ptr.To(true)},
								"labels": {Type: "object", AdditionalProperties: &apiextv1.JSONSchemaPropsOrBool{Allows: true,
									Schema: &apiextv1.JSONSchemaProps{Type: "string"}}},
								"port": {XIntOrString: true, AnyOf: []apiextv1.JSONSchemaProps{{Type: "integer"}, {Type: "string"}}},
							},
						},
						"status": {Type: "object", Properties: map[string]apiextv1.JSONSchemaProps{"phase": {Type: "string", Nullable: true}}},
					},
				}},
			}},
		},
	}
}
