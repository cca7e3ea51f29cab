package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/twill-net/twill/policy/verdictlog"
	kubesm "github.com/twill-net/twill/subnet/kube"
)

// HealthPort is twilld's --healthz-port in the shipped manifest, where
// /verdicts and the policy table's subset are served.
const healthPort = 10267

type policyOptions struct {
	kubeconfig, apiURL string
	endpoint           string // twilld's health address, e.g. http://127.0.0.1:10267
	port               int
}

func (o *policyOptions) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.kubeconfig, "kubeconfig", "", "the cluster's kubeconfig (in a pod: its ServiceAccount)")
	cmd.Flags().StringVar(&o.apiURL, "kube-api-url", "", "apiserver URL (overrides the kubeconfig's server)")
	cmd.Flags().IntVar(&o.port, "twilld-port", healthPort, "twilld's --healthz-port, reached through the apiserver's node proxy")
}

func (o *policyOptions) client() (*kubernetes.Clientset, error) {
	if o.port < 1 || o.port > 65535 {
		return nil, fmt.Errorf("--twilld-port %d: want a port from 1 to 65535", o.port)
	}
	cfg, err := kubesm.RESTConfig(kubesm.ClientOptions{Kubeconfig: o.kubeconfig, APIURL: o.apiURL, UserAgent: "twillctl"})
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// nodeGet reads path (with query) from the twilld of node: directly at
// --endpoint, else through the apiserver's proxy to the node's port.
func (o *policyOptions) nodeGet(ctx context.Context, cli *kubernetes.Clientset, node, path string, q url.Values) ([]byte, error) {
	if o.endpoint != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(o.endpoint, "/")+path+"?"+q.Encode(), nil)
		if err != nil {
			return nil, fmt.Errorf("--endpoint %q: %w", o.endpoint, err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s: %s", req.URL, resp.Status, bytes.TrimSpace(b))
		}
		return b, err
	}
	req := cli.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node+":"+strconv.Itoa(o.port), "proxy", strings.TrimPrefix(path, "/"))
	for k, vs := range q {
		for _, v := range vs {
			req = req.Param(k, v)
		}
	}
	b, err := req.DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("twilld on node %s, port %d, through the apiserver: %w %s", node, o.port, err, bytes.TrimSpace(b))
	}
	return b, nil
}

func newPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "See and explain NetworkPolicy verdicts"}
	cmd.AddCommand(newPolicyLogCommand(), newPolicyExplainCommand())
	return cmd
}

func newPolicyLogCommand() *cobra.Command {
	var o policyOptions
	var node, pod, output string
	var follow bool
	cmd := &cobra.Command{
		Use:   "log",
		Short: "Print the recent verdicts of a node or a pod: denied connections, and allowed ones where asked",
		Long: `log prints the records of twilld's verdict log: the denied packets of
the pods a NetworkPolicy isolates (at most 10 a second per pod and
direction), and the new connections of the namespaces annotated
twill.io/log-allowed=true (or every pod, with twilld's
--network-policy-log-allowed). Each names the pods, the port and what
decided.

On a node (twillctl lab exec node1 -- twillctl policy log), it reads the
local twilld at --endpoint; with --kubeconfig, it reads the twilld of
--node, or of --pod's node, through the apiserver's node proxy.`,
		Example: `  twillctl policy log --endpoint http://127.0.0.1:10267
  twillctl policy log --kubeconfig ~/.kube/config --pod default/web-0 -f`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			var cli *kubernetes.Clientset
			if o.endpoint == "" {
				var err error
				if cli, err = o.client(); err != nil {
					return err
				}
				if node == "" && pod != "" {
					if node, err = podNode(cmd.Context(), cli, pod); err != nil {
						return err
					}
				}
				if node == "" {
					return fmt.Errorf("give --node or --pod (or --endpoint, on the node)")
				}
			}
			return followLog(cmd.Context(), cmd.OutOrStdout(), &o, cli, node, pod, output, follow)
		},
	}
	o.flags(cmd)
	cmd.Flags().StringVar(&o.endpoint, "endpoint", "", "twilld's health address, on its node (e.g. http://127.0.0.1:10267)")
	cmd.Flags().StringVar(&node, "node", "", "the node whose verdicts to print")
	cmd.Flags().StringVar(&pod, "pod", "", "only the verdicts of this pod (namespace/name)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text, or json (one record a line)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new verdicts")
	return cmd
}

func podNode(ctx context.Context, cli *kubernetes.Clientset, key string) (string, error) {
	ns, name, ok := strings.Cut(key, "/")
	if !ok || ns == "" || name == "" {
		return "", fmt.Errorf("--pod %q: want namespace/name", key)
	}
	p, err := cli.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("--pod %s: %w", key, err)
	}
	if p.Spec.NodeName == "" {
		return "", fmt.Errorf("--pod %s: not scheduled on a node yet", key)
	}
	return p.Spec.NodeName, nil
}

func followLog(ctx context.Context, w io.Writer, o *policyOptions, cli *kubernetes.Clientset, node, pod, output string, follow bool) error {
	since := "0"
	for {
		q := url.Values{"since": {since}, "pod": {pod}}
		if follow {
			q.Set("wait", "30s")
		}
		b, err := o.nodeGet(ctx, cli, node, "/verdicts", q)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading the verdict log: %w", err)
		}
		for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
			var next struct{ Next *uint64 }
			if json.Unmarshal(sc.Bytes(), &next) == nil && next.Next != nil {
				since = strconv.FormatUint(*next.Next, 10)
				continue
			}
			printRecord(w, sc.Bytes(), output)
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		default:
		}
	}
}

func printRecord(w io.Writer, line []byte, output string) {
	if output == "json" {
		fmt.Fprintf(w, "%s\n", line)
		return
	}
	var r verdictlog.Record
	if err := json.Unmarshal(line, &r); err != nil {
		fmt.Fprintf(w, "unreadable record %q: %v\n", line, err)
		return
	}
	name := func(addr, pod string) string {
		if pod == "" {
			return addr
		}
		return pod + " (" + addr + ")"
	}
	port := r.Proto
	if r.Port != 0 {
		port = fmt.Sprintf("%d/%s", r.Port, r.Proto)
	}
	fmt.Fprintf(w, "%s %s %s %s %s -> %s %s: %s\n", r.Time.UTC().Format(time.RFC3339), r.Node, r.Verdict, r.Direction,
		name(r.Src, r.SrcPod), name(r.Dst, r.DstPod), port, r.Policy)
}
