package main

import (
	"fmt"

	"github.com/gd2fs/gd2fs/internal/kvstore"
)

// defaultKVMaxValue is the largest KV value a server takes unless
// --kv-max-value says otherwise (kvstore.Config.MaxValue's default).
const defaultKVMaxValue = 64 << 20

// checkKVSizes refuses KV tier sizes under which puts could never succeed,
// before a server starts: the disk tier is written in segments and frees
// room a whole segment at a time (the oldest one), so it must hold two; a
// smaller tier fills its one segment and then refuses every put forever.
// maxFlag names the flag that sets the largest value ("" where there is
// none, as in gd2fs up).
func checkKVSizes(kc kvstore.Config, maxFlag string) error {
	maxValue := kc.MaxValue
	if maxValue <= 0 {
		maxValue = defaultKVMaxValue
	}
	if kc.DiskBytes <= 0 {
		return nil
	}
	seg := kc.SegmentSize
	if seg <= 0 {
		seg = max(64<<20, 2*maxValue) // kvstore.Open's default
	}
	if kc.DiskBytes >= 2*seg {
		return nil
	}
	hint := "or 0 for no KV disk tier"
	if maxFlag != "" {
		hint = fmt.Sprintf("or lower %s (a segment is twice it, at least 64 MiB)", maxFlag)
	}
	return usage(fmt.Errorf("--kv-disk %s is too small: the KV disk tier is written in %s segments and frees room a segment at a time, "+
		"so it needs two (%s); smaller, it would fill once and refuse every put after. Give --kv-disk at least %s, %s",
		human(kc.DiskBytes), human(seg), human(2*seg), human(2*seg), hint))
}
