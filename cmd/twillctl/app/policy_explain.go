package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/twill-net/twill/policy"
	"github.com/twill-net/twill/policy/clusterread"
)

func newPolicyExplainCommand() *cobra.Command {
	var o policyOptions
	var from, to, port string
	var v6, noCompare bool
	cmd := &cobra.Command{
		Use:   "explain",
		Short: "Say whether a pod may connect to another on a port, and which policy and rule decide",
		Long: `explain reads the pods, namespaces, NetworkPolicies and Nodes from the
apiserver, compiles them for the two pods' nodes as their twilld does
(the same code), and runs the connection's first packet through each
table: it says whether it is allowed, by which policy and rule, or which
pod's default deny drops it, or that no policy selects either pod.

It then compares what decides for the two pods with each node's own
table, read from its twilld through the apiserver's node proxy, and says
where they differ (a twilld of another version, or one that has not yet
seen the latest change).`,
		Example: `  twillctl policy explain --kubeconfig ~/.kube/config --from default/client --to default/web --port 80/tcp`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			proto, num, err := policy.ParsePort(port)
			if err != nil {
				return fmt.Errorf("--port: %w", err)
			}
			cli, err := o.client()
			if err != nil {
				return err
			}
			c, err := clusterread.Read(cmd.Context(), cli)
			if err != nil {
				return err
			}
			a, err := c.Explain(policy.Query{From: from, To: to, Proto: proto, Port: num, V6: v6})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprint(w, a)
			if !noCompare {
				compareNodes(cmd.Context(), w, &o, cli, c, a)
			}
			return nil
		},
	}
	o.flags(cmd)
	cmd.Flags().StringVar(&from, "from", "", "the client pod (namespace/name)")
	cmd.Flags().StringVar(&to, "to", "", "the server pod (namespace/name)")
	cmd.Flags().StringVar(&port, "port", "", "the server's port and protocol, e.g. 80/tcp, 53/udp")
	cmd.Flags().BoolVar(&v6, "ipv6", false, "the pods' IPv6 addresses (dual-stack)")
	cmd.Flags().BoolVar(&noCompare, "no-compare", false, "do not compare with the nodes' tables")
	for _, f := range []string{"from", "to", "port"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

// compareNodes says, for each of the two pods' nodes, whether its twilld's
// table decides for the two pods as the apiserver's state compiles.
func compareNodes(ctx context.Context, w io.Writer, o *policyOptions, cli *kubernetes.Clientset, c *policy.Cluster, a policy.Answer) {
	q := url.Values{"pod": {a.From, a.To}, "ip": {a.Src.String(), a.Dst.String()}}
	nodes := []string{a.SrcNode}
	if a.DstNode != a.SrcNode {
		nodes = append(nodes, a.DstNode)
	}
	for _, node := range nodes {
		want, _ := json.Marshal(c.Compiled(node).Subset(q["pod"], q["ip"]))
		b, err := o.nodeGet(ctx, cli, node, policy.SubsetPath, q)
		if err != nil {
			fmt.Fprintf(w, "  node %s: its table not compared: %v\n", node, err)
			continue
		}
		var got policy.NodeView
		if err := json.Unmarshal(b, &got); err != nil {
			fmt.Fprintf(w, "  node %s: its table not compared: reading %s: %v\n", node, policy.SubsetPath, err)
			continue
		}
		agrees := true
		if b, _ = json.Marshal(got.Ruleset); string(b) != string(want) {
			agrees = false
			fmt.Fprintf(w, "  node %s: DIFFERS: its twilld's table for these pods is not what the apiserver's state compiles to "+
				"(a twilld of another version, or one that has not seen the latest change); the kernel decides by its table\n", node)
		}
		if len(got.Drifted) > 0 {
			agrees = false
			fmt.Fprintf(w, "  node %s: DRIFT: the kernel's table is not what its twilld wrote: %s (twilld repairs it)\n", node, strings.Join(got.Drifted, ", "))
		}
		if got.DriftErr != "" {
			fmt.Fprintf(w, "  node %s: its kernel's table not compared: %s\n", node, got.DriftErr)
		}
		if agrees {
			fmt.Fprintf(w, "  node %s: its twilld's table agrees, and the kernel holds it\n", node)
		}
	}
}
