package app

import (
	"fmt"
	"log/slog"

	"github.com/twill-net/twill/daemon/enforce"
	"github.com/twill-net/twill/internal/version"
	kubesm "github.com/twill-net/twill/subnet/kube"
)

// newEnforcement is --network-policy and its --network-policy-log-* flags
// as the engine's enforcement options: the pods of node, the plugin's
// allocations in allocDir, verdicts on stderr at twilld's --log-level.
func newEnforcement(log *slog.Logger, o options, node, allocDir string) (*enforce.Enforcement, error) {
	var level slog.Level
	_ = level.UnmarshalText([]byte(o.logLevel)) // checked by newLogger
	en, err := enforce.New(enforce.Options{
		Logger:         log,
		Client:         kubesm.ClientOptions{Kubeconfig: o.kubeconfigFile, APIURL: o.kubeAPIURL, UserAgent: "twilld/" + version.Version},
		Node:           node,
		LogDenied:      o.networkPolicyLog,
		LogAllowed:     o.networkPolicyAllowed,
		LogSample:      o.networkPolicySample,
		Verdicts:       enforce.VerdictLogger(level),
		AllocationsDir: allocDir,
	})
	if err != nil {
		return nil, fmt.Errorf("--network-policy: %w", err)
	}
	return en, nil
}
