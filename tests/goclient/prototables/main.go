// Command prototables writes the protobuf field tables the API emulator decodes request bodies
// with: for every message reachable from the built-in kinds the emulator serves (and the
// options kinds), each field's number, JSON name, wire shape and JSON emptiness rules, read by
// reflection from the k8s.io/api Go types' `protobuf` and `json` struct tags. The tables are
// facts of the wire format of the module versions in ../go.mod; the Go client test checks that
// the committed copy is current.
//
// Usage: go run ./prototables > ../../services/embedded/apiserver/protobuf_fields.json
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Types with a hand-written protobuf form: the emulator decodes each by a fixed rule.
var special = map[reflect.Type]string{
	reflect.TypeFor[metav1.Time]():                           "time",
	reflect.TypeFor[metav1.MicroTime]():                      "microtime",
	reflect.TypeFor[metav1.Duration]():                       "duration",
	reflect.TypeFor[resource.Quantity]():                     "quantity",
	reflect.TypeFor[intstr.IntOrString]():                    "intorstr",
	reflect.TypeFor[runtime.RawExtension]():                  "rawjson",
	reflect.TypeFor[metav1.FieldsV1]():                       "rawjson",
	reflect.TypeFor[apiextv1.JSON]():                         "rawjson",
	reflect.TypeFor[apiextv1.JSONSchemaPropsOrArray]():       "schema_or_array",
	reflect.TypeFor[apiextv1.JSONSchemaPropsOrBool]():        "schema_or_bool",
	reflect.TypeFor[apiextv1.JSONSchemaPropsOrStringArray](): "schema_or_strings",
}

// Type is how one value is encoded: a scalar, a special, or a message (Ref names it).
type Type struct {
	Kind string `json:"k"`
	Ref  string `json:"ref,omitempty"`
}

// Field is one message field. Flags: r = repeated, p = pointer (emitted even when zero),
// o = omitempty (a zero non-pointer value is left out of the JSON).
type Field struct {
	Number int    `json:"n"`
	Name   string `json:"name"`
	Type
	Key   *Type  `json:"key,omitempty"`
	Value *Type  `json:"value,omitempty"`
	Flags string `json:"flags,omitempty"`
}

type tables struct {
	Kinds    map[string]string  `json:"kinds"`
	Options  map[string]string  `json:"options"`
	Messages map[string][]Field `json:"messages"`
}

func messageName(t reflect.Type) string {
	parts := strings.Split(t.PkgPath(), "/")
	if len(parts) >= 2 {
		parts = parts[len(parts)-2:]
	}
	return strings.Join(parts, "/") + "." + t.Name()
}

func (tb *tables) valueType(t reflect.Type) Type {
	if s, ok := special[t]; ok {
		return Type{Kind: s}
	}
	switch t.Kind() {
	case reflect.String:
		return Type{Kind: "string"}
	case reflect.Bool:
		return Type{Kind: "bool"}
	case reflect.Int, reflect.Int32, reflect.Int64:
		return Type{Kind: "int"}
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		return Type{Kind: "uint"}
	case reflect.Float64:
		return Type{Kind: "double"}
	case reflect.Float32:
		return Type{Kind: "float"}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return Type{Kind: "bytes"}
		}
	case reflect.Struct:
		return Type{Kind: "msg", Ref: tb.message(t)}
	}
	panic(fmt.Sprintf("no protobuf rule for Go type %v", t))
}

func (tb *tables) message(t reflect.Type) string {
	name := messageName(t)
	if _, done := tb.Messages[name]; done {
		return name
	}
	tb.Messages[name] = nil // mark before recursing: messages refer to themselves (JSONSchemaProps)
	fields := []Field{}     // an empty message (e.g. the status subresource marker) is a table too
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("protobuf")
		if tag == "" {
			continue // TypeMeta and other JSON-only fields
		}
		parts := strings.Split(tag, ",")
		number, err := strconv.Atoi(parts[1])
		if err != nil {
			panic(fmt.Sprintf("%s.%s: bad protobuf tag %q", name, sf.Name, tag))
		}
		jsonTag := strings.Split(sf.Tag.Get("json"), ",")
		f := Field{Number: number, Name: jsonTag[0]}
		for _, opt := range jsonTag[1:] {
			if opt == "omitempty" {
				f.Flags += "o"
			}
		}
		ft := sf.Type
		if ft.Kind() == reflect.Pointer {
			f.Flags += "p"
			ft = ft.Elem()
		}
		switch {
		case special[ft] != "":
			f.Type = tb.valueType(ft)
		case ft.Kind() == reflect.Map:
			f.Type = Type{Kind: "map"}
			k, v := tb.valueType(ft.Key()), tb.valueType(ft.Elem())
			f.Key, f.Value = &k, &v
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.Uint8:
			f.Flags += "r"
			et := ft.Elem()
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			f.Type = tb.valueType(et)
		default:
			f.Type = tb.valueType(ft)
		}
		fields = append(fields, f)
	}
	sort.Slice(fields, func(a, b int) bool { return fields[a].Number < fields[b].Number })
	tb.Messages[name] = fields
	return name
}

func main() {
	tb := &tables{Kinds: map[string]string{}, Options: map[string]string{}, Messages: map[string][]Field{}}
	kinds := map[string]any{
		"v1/Namespace":                      corev1.Namespace{},
		"v1/Pod":                            corev1.Pod{},
		"v1/Binding":                        corev1.Binding{},
		"v1/Secret":                         corev1.Secret{},
		"v1/ConfigMap":                      corev1.ConfigMap{},
		"v1/ServiceAccount":                 corev1.ServiceAccount{},
		"v1/Event":                          corev1.Event{},
		"v1/Node":                           corev1.Node{},
		"events.k8s.io/v1/Event":            eventsv1.Event{},
		"rbac.authorization.k8s.io/v1/Role": rbacv1.Role{},
		"rbac.authorization.k8s.io/v1/RoleBinding":         rbacv1.RoleBinding{},
		"coordination.k8s.io/v1/Lease":                     coordinationv1.Lease{},
		"scheduling.k8s.io/v1/PriorityClass":               schedulingv1.PriorityClass{},
		"apiextensions.k8s.io/v1/CustomResourceDefinition": apiextv1.CustomResourceDefinition{},
	}
	for key, obj := range kinds {
		tb.Kinds[key] = tb.message(reflect.TypeOf(obj))
	}
	// The options kinds are registered in every group version, so a body names any apiVersion.
	for _, obj := range []any{metav1.DeleteOptions{}, metav1.CreateOptions{}, metav1.PatchOptions{}, metav1.UpdateOptions{}} {
		t := reflect.TypeOf(obj)
		tb.Options[t.Name()] = tb.message(t)
	}
	os.Stdout.Write(render(tb))
}

// render writes one message per line: compact, yet a table change reads as a small diff.
func render(tb *tables) []byte {
	var b strings.Builder
	kinds, _ := json.Marshal(tb.Kinds)
	options, _ := json.Marshal(tb.Options)
	fmt.Fprintf(&b, "{\"kinds\": %s,\n\"options\": %s,\n\"messages\": {\n", kinds, options)
	names := make([]string, 0, len(tb.Messages))
	for name := range tb.Messages {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		fields, err := json.Marshal(tb.Messages[name])
		if err != nil {
			panic(err)
		}
		sep := ","
		if i == len(names)-1 {
			sep = ""
		}
		fmt.Fprintf(&b, "%q: %s%s\n", name, fields, sep)
	}
	b.WriteString("}}\n")
	return []byte(b.String())
}
