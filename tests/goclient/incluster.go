package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// serviceAccountDirEnv names the local directory of the pod's service-account mount when a
// node runs pods as plain processes (runnerscale's node-sim); unset in a real pod.
const serviceAccountDirEnv = "RUNNERSCALE_SERVICEACCOUNT_DIR"

// inClusterConfig is rest.InClusterConfig, except that the token and CA files are read from
// $RUNNERSCALE_SERVICEACCOUNT_DIR when it is set: InClusterConfig reads fixed paths only.
func inClusterConfig() (*rest.Config, error) {
	dir := os.Getenv(serviceAccountDirEnv)
	if dir == "" {
		return rest.InClusterConfig()
	}
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, rest.ErrNotInCluster
	}
	if _, err := os.Stat(dir + "/token"); err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            "https://" + net.JoinHostPort(host, port),
		TLSClientConfig: rest.TLSClientConfig{CAFile: dir + "/ca.crt"},
		BearerTokenFile: dir + "/token",
	}, nil
}

// runInCluster is the -in-cluster mode: connect as the pod's service account, read the pod's
// namespace from the mounted file, and record success in a ConfigMap the test looks for.
func runInCluster(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cfg, err := inClusterConfig()
	if err != nil {
		return fmt.Errorf("in-cluster config: %w", err)
	}
	dir := os.Getenv(serviceAccountDirEnv)
	if dir == "" {
		dir = "/var/run/secrets/kubernetes.io/serviceaccount"
	}
	raw, err := os.ReadFile(dir + "/namespace")
	if err != nil {
		return fmt.Errorf("read the pod's namespace file: %w", err)
	}
	ns := strings.TrimSpace(string(raw))
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	root, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get kube-root-ca.crt over HTTPS as the service account: %w", err)
	}
	ca, err := os.ReadFile(dir + "/ca.crt")
	if err != nil || string(ca) != root.Data["ca.crt"] {
		return fmt.Errorf("the mounted ca.crt is not the cluster's kube-root-ca.crt (%v)", err)
	}
	_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "in-cluster-ok"},
		Data:       map[string]string{"host": cfg.Host},
	}, metav1.CreateOptions{})
	return err
}
