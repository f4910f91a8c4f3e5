package bootstrap

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// Secret is the 128-bit secret every connection to a TCP store must prove it
// knows. The zero Secret is a valid (if guessable) key.
type Secret [16]byte

// NewSecret returns a random secret.
func NewSecret() (Secret, error) {
	var s Secret
	if _, err := rand.Read(s[:]); err != nil {
		return s, fmt.Errorf("bootstrap: random secret: %w", err)
	}
	return s, nil
}

// DeriveSecret turns any string shared by the ranks (HCOMM_SECRET, a rank
// table's contents) into a Secret: the first 16 bytes of its SHA-256.
func DeriveSecret(s string) Secret {
	h := sha256.Sum256([]byte("hcomm/bootstrap/secret\x00" + s))
	var out Secret
	copy(out[:], h[:])
	return out
}

// String returns the secret as 32 lowercase hex digits.
func (s Secret) String() string { return hex.EncodeToString(s[:]) }

// ErrAuth is wrapped by Dial's error when the server refused this client's
// proof of the secret (the store serves another communicator), or the server
// could not prove it knows the secret.
var ErrAuth = errors.New("bootstrap: secret proof refused")

// ErrJobFailed is wrapped by the errors of a client whose store refused the
// ranks it serves as one job: this client's claim did not fit the job (a rank
// count that differs, a rank another process holds), or another rank's claim
// made the rendezvous fail for every rank (the reason says which). Dial does
// not retry it.
var ErrJobFailed = errors.New("bootstrap: the job's ranks do not fit together")

// Wire constants (spec.md).
const (
	version       = 2
	nonceLen      = 32
	macLen        = sha256.Size
	serverHello   = 4 + 1 + nonceLen
	clientHello   = 4 + 1 + 4 + 4 + 4 + 1 + nonceLen + macLen // then the host name
	serverVerdict = 1 + macLen + 2                            // then the reason
	maxReason     = 1 << 10
	headerLen     = 4 + 1 + 8
	maxBody       = MaxKeyLen + MaxValueLen + 16

	opSet    = 1
	opGet    = 2
	opAdd    = 3
	opDel    = 4
	opCancel = 5
	opBye    = 6
	opPing   = 7
	opTryGet = 8
	opAbort  = 9
	opOK     = 0x81
	opErr    = 0x82

	verdictRefused  = 0 // the proof of the secret failed
	verdictAdmitted = 1
	verdictJob      = 2 // the proof holds, the claim does not fit the job
)

var (
	magicServer = [4]byte{'H', 'C', 'B', 'S'}
	magicClient = [4]byte{'H', 'C', 'B', 'C'}
)

// Claim is what a connecting client says of itself: its rank, the rank
// count of its job, and where it runs (for the messages that name two
// processes claiming one rank).
type Claim struct {
	Rank, NRanks int
	PID          int    // 0: this process's
	Host         string // "": this host's name; at most 255 bytes are sent
}

func (c Claim) String() string {
	return fmt.Sprintf("rank %d (pid %d on %s)", c.Rank, c.PID, c.Host)
}

// claimBytes is the claim as the MACs cover it: rank, nranks, pid, host
// length, host.
func claimBytes(c Claim) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(int32(c.Rank)))
	b = binary.BigEndian.AppendUint32(b, uint32(int32(c.NRanks)))
	b = binary.BigEndian.AppendUint32(b, uint32(c.PID))
	b = append(b, byte(len(c.Host)))
	return append(b, c.Host...)
}

func clientMAC(s Secret, sNonce, cNonce []byte, claim []byte) []byte {
	m := hmac.New(sha256.New, s[:])
	m.Write([]byte("hcomm/bootstrap/client\x00"))
	m.Write(sNonce)
	m.Write(cNonce)
	m.Write(claim)
	return m.Sum(nil)
}

func serverMAC(s Secret, sNonce, cNonce []byte, claim []byte, verdict byte, reason string) []byte {
	m := hmac.New(sha256.New, s[:])
	m.Write([]byte("hcomm/bootstrap/server\x00"))
	m.Write(cNonce)
	m.Write(sNonce)
	m.Write(claim)
	m.Write([]byte{verdict})
	m.Write([]byte(reason))
	return m.Sum(nil)
}

// clipReason cuts a verdict's reason to what the wire carries (before the
// MAC covers it).
func clipReason(r string) string {
	if len(r) > maxReason {
		return r[:maxReason]
	}
	return r
}

// verdictBytes is the server's answer to a hello (spec.md); reason is
// clipped.
func verdictBytes(verdict byte, mac []byte, reason string) []byte {
	b := append([]byte{verdict}, mac...)
	if len(mac) == 0 {
		b = append(b, make([]byte, macLen)...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(reason)))
	return append(b, reason...)
}

// header is a frame header: body length, op, request id (spec.md).
type header [headerLen]byte

func (h *header) bodyLen() uint32 { return binary.BigEndian.Uint32(h[0:4]) }
func (h *header) op() byte        { return h[4] }
func (h *header) id() uint64      { return binary.BigEndian.Uint64(h[5:13]) }

func frame(op byte, id uint64, body ...[]byte) []byte {
	n := 0
	for _, b := range body {
		n += len(b)
	}
	out := make([]byte, headerLen, headerLen+n)
	binary.BigEndian.PutUint32(out[0:4], uint32(n))
	out[4] = op
	binary.BigEndian.PutUint64(out[5:13], id)
	for _, b := range body {
		out = append(out, b...)
	}
	return out
}

// readFrame reads one frame; a body longer than maxBody is an error.
func readFrame(r io.Reader) (header, []byte, error) {
	var h header
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return h, nil, err
	}
	if h.bodyLen() > maxBody {
		return h, nil, fmt.Errorf("frame body of %d bytes exceeds %d", h.bodyLen(), maxBody)
	}
	body := make([]byte, h.bodyLen())
	if _, err := io.ReadFull(r, body); err != nil {
		return h, nil, err
	}
	return h, body, nil
}

// encodeSet and decodeSet: u32 key length, key, value.
func encodeSet(key string, value []byte) []byte {
	b := make([]byte, 4, 4+len(key)+len(value))
	binary.BigEndian.PutUint32(b, uint32(len(key)))
	b = append(b, key...)
	return append(b, value...)
}

func decodeSet(body []byte) (string, []byte, error) {
	if len(body) < 4 {
		return "", nil, fmt.Errorf("set body of %d bytes is shorter than its key length", len(body))
	}
	n := binary.BigEndian.Uint32(body)
	if uint64(n) > uint64(len(body)-4) {
		return "", nil, fmt.Errorf("set key length %d exceeds the body's %d bytes", n, len(body)-4)
	}
	return string(body[4 : 4+n]), body[4+n:], nil
}

// decodeAdd: i64 delta, key.
func decodeAdd(body []byte) (string, int64, error) {
	if len(body) < 8 {
		return "", 0, fmt.Errorf("add body of %d bytes is shorter than its delta", len(body))
	}
	return string(body[8:]), int64(binary.BigEndian.Uint64(body)), nil
}
