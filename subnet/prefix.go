package subnet

import (
	"math/big"
	"net/netip"
)

// nextSubnet returns the subnet of length bits following the one at a, or
// an invalid Addr on overflow.
func nextSubnet(a netip.Addr, bits int) netip.Addr {
	return addToAddr(a, big.NewInt(1), bits)
}

// lastSubnet returns the address of the last subnet of length bits in p.
func lastSubnet(p netip.Prefix, bits int) netip.Addr {
	n := new(big.Int).Lsh(big.NewInt(1), uint(bits-p.Bits()))
	n.Sub(n, big.NewInt(1))
	return addToAddr(p.Addr(), n, bits)
}

// NthSubnet returns the n-th subnet of length bits counting from a.
func NthSubnet(a netip.Addr, n uint64, bits int) netip.Addr {
	return addToAddr(a, new(big.Int).SetUint64(n), bits)
}

func addToAddr(a netip.Addr, n *big.Int, bits int) netip.Addr {
	step := new(big.Int).Lsh(n, uint(a.BitLen()-bits))
	v := new(big.Int).SetBytes(a.AsSlice())
	v.Add(v, step)
	b := v.Bytes()
	size := a.BitLen() / 8
	if len(b) > size {
		return netip.Addr{}
	}
	buf := make([]byte, size)
	copy(buf[size-len(b):], b)
	out, _ := netip.AddrFromSlice(buf)
	return out
}

func subnetsBetween(minA, maxA netip.Addr, bits int) uint64 {
	if !minA.IsValid() || !maxA.IsValid() || maxA.Less(minA) {
		return 0
	}
	lo := new(big.Int).SetBytes(minA.AsSlice())
	hi := new(big.Int).SetBytes(maxA.AsSlice())
	d := new(big.Int).Sub(hi, lo)
	d.Rsh(d, uint(minA.BitLen()-bits))
	d.Add(d, big.NewInt(1))
	if d.BitLen() > 62 {
		return 1 << 62
	}
	return d.Uint64()
}
