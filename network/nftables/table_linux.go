package nftables

import (
	"log/slog"
	"sync"

	"github.com/google/nftables"

	"github.com/twill-net/twill/network"
	knft "github.com/twill-net/twill/nl/nft"
	"github.com/twill-net/twill/nl/nftsync"
)

// Table keeps twill's table equal to the desired rules of every address
// family in use.
type Table struct {
	Logger   *slog.Logger
	Networks []network.NetworkPair
	IPMasq   bool
	// Repaired, when set, is called for each repair of a table that had
	// been written and then changed behind twill's back.
	Repaired func()
	// Kernel is the kernel's nftables (nil: the caller's network
	// namespace's).
	Kernel knft.Kernel

	mu     sync.Mutex
	wrote  bool            // guarded by mu; a later difference is drift
	engine *nftsync.Engine // guarded by mu
}

var _ network.Syncer = (*Table)(nil)

// tableEngine is the engine that writes twill's table into k (nil: the
// caller's namespace).
func tableEngine(k knft.Kernel) *nftsync.Engine {
	if k == nil {
		k = knft.Conn{}
	}
	return &nftsync.Engine{Kernel: k, Family: nftables.TableFamilyINet, Name: TableName}
}

func (t *Table) eng() *nftsync.Engine {
	if t.engine == nil {
		t.engine = tableEngine(t.Kernel)
	}
	return t.engine
}

// Sync makes twill's table equal to the desired rules, in one transaction
// (readers see the old table or the new one); it writes nothing when they
// are equal.
func (t *Table) Sync() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	want, err := desired(t.Networks, t.IPMasq)
	if err != nil {
		return err
	}
	if t.wrote {
		d, err := t.eng().Drift(want)
		if err != nil {
			return err
		}
		if d.Clean() {
			return nil
		}
		t.Logger.Info("nftables table drifted; rewriting", "table", "inet "+TableName,
			"missing", d.Missing, "extra", d.Extra, "wrong", d.Wrong)
		if t.Repaired != nil {
			defer t.Repaired()
		}
	}
	if _, err := t.eng().Sync(want, true); err != nil {
		return err
	}
	t.wrote = true
	return nil
}

// Drift says how the kernel's table differs from the desired rules,
// without changing anything.
func (t *Table) Drift() (network.RuleDrift, error) {
	want, err := desired(t.Networks, t.IPMasq)
	if err != nil {
		return network.RuleDrift{}, err
	}
	t.mu.Lock()
	e := t.eng()
	t.mu.Unlock()
	d, err := e.Drift(want)
	return network.RuleDrift{Missing: d.Missing, Extra: d.Extra, Wrong: d.Wrong}, err
}

// Delete removes twill's table from k (nil: the caller's namespace) if it
// exists, and says whether it did.
func Delete(k knft.Kernel) (bool, error) {
	return tableEngine(k).Delete()
}
