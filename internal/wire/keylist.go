package wire

import (
	"encoding/binary"

	"github.com/gd2fs/gd2fs/errs"
)

// AppendKeyList encodes keys as the payload of an OpKVScan response: for
// each key a u16 length and the key.
func AppendKeyList(b []byte, keys []string) []byte {
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
	}
	return b
}

// ParseKeyList decodes an OpKVScan response payload.
func ParseKeyList(b []byte) ([]string, error) {
	var keys []string
	for len(b) > 0 {
		if len(b) < 2 {
			return nil, errs.New(errs.ErrBadRequest, "wire: key list: truncated length")
		}
		n := int(binary.LittleEndian.Uint16(b))
		if len(b) < 2+n {
			return nil, errs.New(errs.ErrBadRequest, "wire: key list: truncated key")
		}
		keys = append(keys, string(b[2:2+n]))
		b = b[2+n:]
	}
	return keys, nil
}
