//go:build tools

// Package tools pins the helm command for `go build helm.sh/helm/v4/cmd/helm` (tests/tools/helm.py):
// this module's go.mod lifts Helm's k8s.io requirements to the control plane's v0.37.2, so the
// two builds share the Go build cache.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
