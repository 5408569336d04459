/*
 * kvcast._native: the host data path's per-datagram work in C (docs/hostagent.md, "Native data
 * path"). Python keeps every decision that is not per datagram (which GETs are in flight, when
 * to retry, which path to take); this module only moves bytes:
 *
 *   crc32(data, value=0)        zlib's CRC-32 (same polynomial, same chaining): carry-less
 *                               multiplication (VPCLMULQDQ or PCLMULQDQ) where the processor has
 *                               it, else libz, else slice-by-8 tables.
 *   recv_fetch(...)             recvmmsg() a batch of datagrams for one fetch; for each DATA that
 *                               answers one of the fetch's GETs (or is a replica of its group):
 *                               check source, header, range, owner and CRC, copy the new
 *                               fragments into the tensor (or receive a predicted DATA straight
 *                               into it and check it there) and mark them present; report one
 *                               event per such DATA and hand every other datagram back as bytes.
 *   send_batch(fd, addr, msgs)  sendmmsg() of (header, payload) pairs to one address.
 *   send_data(...)              a pool node's DATAs for a GET's fragment range: headers and
 *                               CRCs built in C, sent with sendmmsg().
 *   send_gets(fd, buf, slot, n) an agent's GETs that are due at once, one sendmmsg().
 *   recv_fetches(...)           recv_fetch for several fetches at once (a window of chunks): each
 *                               DATA goes to the fetch whose tenant and key it names.
 *   recv_datagrams(...)         recvmmsg() of a pool node's GETs: lengths and senders.
 *   recv_count(...)             recvmmsg() that only counts: the benchmarks' receive ceiling.
 *
 * Every function has a pure-Python equivalent (hostagent/fetch.py, poolnode/server.py) that the
 * same tests run; this module is built by `pip install -e .` and is optional.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/udp.h>

/* ------------------------------------------------------------------ CRC-32 (zlib's) */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        }
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

/* zlib's own crc32() where the process can find libz (it is what Python's zlib module uses,
 * and faster than the tables below); else the tables. Same function either way. */
typedef unsigned long (*zlib_crc32_t)(unsigned long, const unsigned char *, unsigned int);
static zlib_crc32_t zlib_crc32 = NULL;

static uint32_t crc32_tables(uint32_t value, const uint8_t *p, size_t n);

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_CLMUL_PATH 1
static int have_clmul = 0;

/* One fold step: the 128-bit block x carried 128 (k = k1) or 512 (k = k4) bits ahead onto next. */
#define CLMUL_FOLD(x, k, next)                                                                 \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128((x), (k), 0x00),                          \
                                _mm_clmulepi64_si128((x), (k), 0x11)),                         \
                  (next))

/*
 * The end of both carry-less paths: folds the remaining whole 16-byte blocks of p into x (with
 * the 128-bit constants k1), then x's block, whose CRC from a zero state is the CRC of all
 * before it, and the tail of fewer than 16 bytes go through the tables.
 */
__attribute__((target("pclmul,sse4.1"))) static inline uint32_t
crc32_clmul_finish(__m128i x, __m128i k1, const uint8_t *p, size_t n) {
    while (n >= 16) {
        x = CLMUL_FOLD(x, k1, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
    uint8_t block[16];
    _mm_storeu_si128((__m128i *)block, x);
    uint32_t crc = crc32_tables(0xFFFFFFFFu, block, 16); /* from a zero state */
    return crc32_tables(crc, p, n);
}

/*
 * CRC-32 by carry-less multiplication (PCLMULQDQ): fold the data 64 bytes at a time, then 16,
 * down to one 128-bit block whose CRC (from a zero state) is the CRC of everything before it;
 * that block and the tail go through the tables (crc32_clmul_finish). The folding constants
 * are x^(4*128+-32) and x^(128+-32) mod the CRC-32 polynomial, bit-reflected (as in Intel's
 * "Fast CRC Computation Using PCLMULQDQ" and Linux's crc32-pclmul). Same results as zlib; a
 * test checks every length from 0 to 1,100 bytes and random seeds against zlib.
 */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_clmul(uint32_t value,
                                                                        const uint8_t *p,
                                                                        size_t n) {
    const __m128i k4 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k1 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    __m128i x0 = _mm_loadu_si128((const __m128i *)p);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)~value));
    p += 64;
    n -= 64;
    while (n >= 64) {
        x0 = CLMUL_FOLD(x0, k4, _mm_loadu_si128((const __m128i *)p));
        x1 = CLMUL_FOLD(x1, k4, _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = CLMUL_FOLD(x2, k4, _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = CLMUL_FOLD(x3, k4, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    __m128i x = CLMUL_FOLD(x0, k1, x1);
    x = CLMUL_FOLD(x, k1, x2);
    x = CLMUL_FOLD(x, k1, x3);
    return crc32_clmul_finish(x, k1, p, n);
}

/*
 * The same folding with VPCLMULQDQ on 256-bit registers (AVX2): four registers hold 128 bytes
 * (eight 128-bit lanes), each lane folded 1024 bits ahead per step (constants x^(8*128+-32)
 * mod P, bit-reflected, as above), so eight carry-less products are in flight at once instead
 * of four; at the end the eight lanes are folded into one with the 128-bit constants and the
 * rest goes through crc32_clmul_finish. Needs n >= 128. Same values as zlib
 * (tests/kvcast/test_native.py).
 */
static int have_vclmul = 0;

__attribute__((target("vpclmulqdq,avx2,pclmul,sse4.1"))) static uint32_t crc32_vclmul(
    uint32_t value, const uint8_t *p, size_t n) {
    const __m256i k8 = _mm256_set_epi64x(0x14a7fe880LL, 0x1e88ef372LL, 0x14a7fe880LL,
                                         0x1e88ef372LL);
    const __m128i k1 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    __m256i y0 = _mm256_loadu_si256((const __m256i *)p);
    __m256i y1 = _mm256_loadu_si256((const __m256i *)(p + 32));
    __m256i y2 = _mm256_loadu_si256((const __m256i *)(p + 64));
    __m256i y3 = _mm256_loadu_si256((const __m256i *)(p + 96));
    y0 = _mm256_xor_si256(y0, _mm256_zextsi128_si256(_mm_cvtsi32_si128((int)~value)));
    p += 128;
    n -= 128;
#define VFOLD(y, next)                                                                         \
    _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128((y), k8, 0x00),                 \
                                      _mm256_clmulepi64_epi128((y), k8, 0x11)),                \
                     (next))
    while (n >= 128) {
        y0 = VFOLD(y0, _mm256_loadu_si256((const __m256i *)p));
        y1 = VFOLD(y1, _mm256_loadu_si256((const __m256i *)(p + 32)));
        y2 = VFOLD(y2, _mm256_loadu_si256((const __m256i *)(p + 64)));
        y3 = VFOLD(y3, _mm256_loadu_si256((const __m256i *)(p + 96)));
        p += 128;
        n -= 128;
    }
#undef VFOLD
    __m128i x = _mm256_castsi256_si128(y0);
    x = CLMUL_FOLD(x, k1, _mm256_extracti128_si256(y0, 1));
    x = CLMUL_FOLD(x, k1, _mm256_castsi256_si128(y1));
    x = CLMUL_FOLD(x, k1, _mm256_extracti128_si256(y1, 1));
    x = CLMUL_FOLD(x, k1, _mm256_castsi256_si128(y2));
    x = CLMUL_FOLD(x, k1, _mm256_extracti128_si256(y2, 1));
    x = CLMUL_FOLD(x, k1, _mm256_castsi256_si128(y3));
    x = CLMUL_FOLD(x, k1, _mm256_extracti128_si256(y3, 1));
    return crc32_clmul_finish(x, k1, p, n);
}
#undef CLMUL_FOLD
#endif

/* Continues a CRC-32 from `value` (zlib.crc32(data, value)). */
static uint32_t crc32_update(uint32_t value, const uint8_t *p, size_t n) {
#ifdef HAVE_CLMUL_PATH
    if (have_vclmul && n >= 256) {
        return crc32_vclmul(value, p, n);
    }
    if (have_clmul && n >= 64) {
        return crc32_clmul(value, p, n);
    }
#endif
    if (zlib_crc32 != NULL && n <= 0xFFFFFFFFu) {
        return (uint32_t)zlib_crc32(value, p, (unsigned int)n);
    }
    return crc32_tables(value, p, n);
}

static uint32_t crc32_tables(uint32_t value, const uint8_t *p, size_t n) {
    uint32_t c = ~value;
    while (n && ((uintptr_t)p & 7)) {
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c; /* little-endian load, as the tables assume */
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) {
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    }
    return ~c;
}

static PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &value)) {
        return NULL;
    }
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc32_update(value, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* ------------------------------------------------------------------ KVP header */

#define KVP_HDR 40
#define OP_DATA 2
#define FLAG_HIT 0x01
#define FLAG_REPLICA 0x08
#define MISSING 0
#define PRESENT 2
#define MAX_BATCH 64
#define EVENT_FIELDS 7
#define STREAM_FIELDS 7

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* Points MAX_BATCH recvmmsg() headers at consecutive `slot`-byte slots of `base`, and at
 * `src` for the senders' addresses when given. */
static void batch_slots(struct mmsghdr *msgs, struct iovec *iov, struct sockaddr_in *src,
                        uint8_t *base, Py_ssize_t slot) {
    for (int i = 0; i < MAX_BATCH; i++) {
        iov[i].iov_base = base + (size_t)i * slot;
        iov[i].iov_len = (size_t)slot;
        memset(&msgs[i].msg_hdr, 0, sizeof(msgs[i].msg_hdr));
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        if (src != NULL) {
            msgs[i].msg_hdr.msg_name = &src[i];
            msgs[i].msg_hdr.msg_namelen = sizeof(src[i]);
        }
    }
}

/* One fetch as the receive functions see it: the chunk, its GETs' request ids, and where its
 * fragments go (the tensor's bytes, the per-fragment state, the owner of each fragment). */
typedef struct {
    int tenant, get_group;
    unsigned long long key;
    unsigned int crc_seed, rid_base, rids_used;
    Py_ssize_t nbytes, nfrag;
    uint8_t *out, *frag;
    uint64_t *owner;
    int64_t *stream;
} fetch_t;

/* Takes one datagram for fetch `f` if it is a DATA answering one of its GETs within the
 * fragments that GET owns, or a replica of `my_group`: checks the CRC, copies the new fragments
 * and marks them present; writes an event (its last field `tag`) for an answer, or extends the
 * previous one (see recv_fetch), counts a replica in f->stream. Returns 0 when the datagram is
 * not such a DATA (the slow path's). */
static int take_data(const fetch_t *f, const uint8_t *d, size_t len, int version_op,
                     int my_group, int frag_bytes, int64_t *ev, int *nev, int64_t tag,
                     int in_place) {
    if (len < KVP_HDR || d[0] != version_op || be16(d + 4) != f->tenant ||
        be64(d + 8) != f->key) {
        return 0;
    }
    uint8_t flags = d[1];
    int group = be16(d + 6);
    uint32_t rid = be32(d + 16);
    long first = be16(d + 24);
    long total = be16(d + 26);
    long plen = be16(d + 28);
    uint32_t crc = be32(d + 36);
    long nfrag = (long)f->nfrag;
    long last = first + (plen + frag_bytes - 1) / frag_bytes;
    long lo = first * (long)frag_bytes;
    long end = last * (long)frag_bytes < (long)f->nbytes ? last * (long)frag_bytes : (long)f->nbytes;
    int ours = (uint32_t)(rid - f->rid_base) < f->rids_used;
    int replica = !ours && (flags & FLAG_REPLICA) && group != 0 && group == my_group;
    int shape_ok = plen > 0 && (size_t)plen <= len - KVP_HDR && total == nfrag && last <= nfrag &&
                   lo + plen == end;
    if (!shape_ok || !((ours && group == f->get_group) || replica)) {
        return 0;
    }
    for (long i = first; ours && i < last; i++) {
        if (f->owner[i] != rid) {
            return 0;
        }
    }
    /* In place (recv_batch_into's scatter): the kernel put the payload at its offset in the
     * tensor, where no fragment was PRESENT, and nothing has written there since. */
    const uint8_t *pl = in_place ? f->out + lo : d + KVP_HDR;
    uint8_t idx[2] = {d[24], d[25]};
    uint32_t want = crc32_update(crc32_tables(f->crc_seed, idx, 2), pl, (size_t)plen);
    long added = 0;
    int crc_ok = want == crc;
    if (crc_ok) {
        for (long i = first; i < last; i++) {
            if (f->frag[i] != PRESENT) {
                if (!in_place) {
                    long a = i * (long)frag_bytes;
                    long b = a + frag_bytes < end ? a + frag_bytes : end;
                    memcpy(f->out + a, pl + (a - lo), (size_t)(b - a));
                }
                f->frag[i] = PRESENT;
                added++;
            }
        }
    }
    if (!ours) {
        int64_t *st = f->stream;
        if (crc_ok && last > st[4]) {
            st[4] = last;
        }
        if (!crc_ok) {
            st[3]++;
        } else if (added == 0) {
            st[2]++;
        } else {
            st[(flags & FLAG_HIT) ? 0 : 1] += added;
        }
        return 1;
    }
    if (*nev > 0 && crc_ok && added > 0 && !(flags & FLAG_HIT)) {
        /* The next DATA of the same GET right after the last one taken (a pool node answers a
         * GET with several in a row): one event for both, so Python books a GET once per
         * batch, not once per DATA. */
        int64_t *p = ev + (size_t)(*nev - 1) * EVENT_FIELDS;
        if (p[0] == rid && p[6] == tag && p[5] == 1 && p[3] > 0 && p[4] == flags &&
            p[2] == first) {
            p[2] = last;
            p[3] += added;
            return 1;
        }
    }
    int64_t *e = ev + (size_t)(*nev) * EVENT_FIELDS;
    e[0] = rid;
    e[1] = first;
    e[2] = last;
    e[3] = added;
    e[4] = flags;
    e[5] = crc_ok;
    e[6] = tag;
    (*nev)++;
    return 1;
}

/* Parses `trusted` (a tuple of (ipv4 host-order int, port)) into at most 16 entries.
 * Returns the count, or -1 with an exception set. */
static Py_ssize_t parse_trusted(PyObject *trusted, uint32_t *tip, uint16_t *tport) {
    Py_ssize_t ntrusted = PyTuple_GET_SIZE(trusted);
    if (ntrusted > 16) {
        ntrusted = 16;
    }
    for (Py_ssize_t i = 0; i < ntrusted; i++) {
        unsigned long ip;
        int port;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(trusted, i), "ki", &ip, &port)) {
            return -1;
        }
        tip[i] = (uint32_t)ip;
        tport[i] = (uint16_t)port;
    }
    return ntrusted;
}

/* recvmmsg() of up to MAX_BATCH datagrams into `rx` (MSG_DONTWAIT). Returns the count (0 when
 * the socket would block or reported an ICMP error; *would_block says which), or -1 with an
 * exception set. */
static int recv_batch(int fd, struct mmsghdr *msgs, int *would_block) {
    int got;
    Py_BEGIN_ALLOW_THREADS
    got = recvmmsg(fd, msgs, MAX_BATCH, MSG_DONTWAIT, NULL);
    Py_END_ALLOW_THREADS
    *would_block = 0;
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNREFUSED) {
            *would_block = errno != ECONNREFUSED;
            return 0;
        }
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return got;
}

/* Whether datagram m of a batch comes from the KVP port or a trusted sender. */
static int source_ok(const struct sockaddr_in *src, int kvp_port, const uint32_t *tip,
                     const uint16_t *tport, Py_ssize_t ntrusted) {
    uint16_t sport = ntohs(src->sin_port);
    if (sport == kvp_port) {
        return 1;
    }
    uint32_t sip = ntohl(src->sin_addr.s_addr);
    for (Py_ssize_t i = 0; i < ntrusted; i++) {
        if (tip[i] == sip && tport[i] == sport) {
            return 1;
        }
    }
    return 0;
}

/* Appends datagram `d` to `slow` as bytes. Returns -1 with an exception set on failure. */
static int append_slow(PyObject *slow, const uint8_t *d, size_t len) {
    PyObject *b = PyBytes_FromStringAndSize((const char *)d, (Py_ssize_t)len);
    if (b == NULL || PyList_Append(slow, b) < 0) {
        Py_XDECREF(b);
        return -1;
    }
    Py_DECREF(b);
    return 0;
}

#define MAX_FETCHES 64

/* Scatter (recv_fetch only): a DATA of at least SCATTER_MIN_FRAGS fragments is received
 * straight into its place in the tensor when its range was predicted; below that the copy from
 * the batch buffer costs less than a mispredicted slot. */
#define SCATTER_MIN_FRAGS 4

/*
 * Plans where a batch's payloads go for one fetch (docs/hostagent.md, "Receiving in place"):
 * slot m's DATA is predicted to be the m-th DATA after the last one received (stream[5], the
 * fragment after it; stream[6], the most fragments a DATA of the last batch carried), and its
 * payload bytes are received at their offset in the tensor (iovec 1; the header into the slot,
 * iovec 0, and anything longer after it, iovec 2) when none of the predicted range's fragments
 * is PRESENT.
 * The predicted ranges of a batch do not overlap. Writes pfirst[m] (-1: slot m not planned) and
 * pbytes[m]. A fragment that is PRESENT is never a destination, so a verified fragment is never
 * written by the kernel; what lands in a range that is not PRESENT stays not PRESENT until
 * take_data has checked its CRC in place.
 */
static void plan_scatter(const fetch_t *f, int frag_bytes, struct mmsghdr *msgs,
                         struct iovec (*iov3)[3], uint8_t *base, Py_ssize_t slot, long *pfirst,
                         long *pbytes) {
    long nfrag = (long)f->nfrag;
    long k = (long)f->stream[6];
    long pos = (long)f->stream[5];
    for (int m = 0; m < MAX_BATCH; m++) {
        pfirst[m] = -1;
    }
    if (k < SCATTER_MIN_FRAGS || k > nfrag || pos < 0) {
        return;
    }
    for (int m = 0; m < MAX_BATCH && pos < nfrag; m++) {
        long last = pos + k < nfrag ? pos + k : nfrag;
        long lo = pos * (long)frag_bytes;
        long hi = last * (long)frag_bytes < (long)f->nbytes ? last * (long)frag_bytes
                                                             : (long)f->nbytes;
        if (hi > lo && hi - lo <= (long)slot - KVP_HDR &&
            memchr(f->frag + pos, PRESENT, (size_t)(last - pos)) == NULL) {
            uint8_t *d = base + (size_t)m * (size_t)slot;
            iov3[m][0].iov_base = d;
            iov3[m][0].iov_len = KVP_HDR;
            iov3[m][1].iov_base = f->out + lo;
            iov3[m][1].iov_len = (size_t)(hi - lo);
            iov3[m][2].iov_base = d + KVP_HDR + (hi - lo);
            iov3[m][2].iov_len = (size_t)(slot - KVP_HDR - (hi - lo));
            msgs[m].msg_hdr.msg_iov = iov3[m];
            msgs[m].msg_hdr.msg_iovlen = 3;
            pfirst[m] = pos;
            pbytes[m] = hi - lo;
        }
        pos = last;
    }
}

/* After a planned batch: whether slot m's datagram is the DATA predicted for it (the payload
 * is then in place in the tensor), else puts the payload bytes back behind the header in the
 * slot (the datagram is whole there again) and returns 0. Also learns the next prediction from
 * the DATA's header: stream[5], the fragment after it; *batch_k, the most fragments a DATA of
 * this batch carried, not counting the chunk's last (stream[6] after the batch). A header only
 * guides the plan, never what is taken. */
static int settle_slot(const fetch_t *f, int frag_bytes, int version_op, uint8_t *d, size_t len,
                       int trunc, long pfirst, long pbytes, long *batch_k) {
    int planned = pfirst >= 0;
    if (!trunc && len >= KVP_HDR && d[0] == version_op && be16(d + 4) == f->tenant &&
        be64(d + 8) == f->key) {
        long first = be16(d + 24);
        long plen = be16(d + 28);
        long last = first + (plen + frag_bytes - 1) / frag_bytes;
        if (plen > 0 && last <= (long)f->nfrag) {
            f->stream[5] = last;
            if (last < (long)f->nfrag && last - first > *batch_k) {
                *batch_k = last - first;
            }
            if (planned && first == pfirst && plen == pbytes && len == (size_t)(KVP_HDR + plen)) {
                return 1;
            }
        }
    }
    if (planned && len > KVP_HDR) {
        size_t n = len - KVP_HDR < (size_t)pbytes ? len - KVP_HDR : (size_t)pbytes;
        memcpy(d + KVP_HDR, f->out + pfirst * (long)frag_bytes, n);
    }
    return 0;
}

/* recvmmsg() batches one receive call takes at most (each of MAX_BATCH datagrams). */
#define MAX_ROUNDS 16

/* Whether every fragment of one of the fetches of f[0..nf) that `touched` marks is PRESENT
 * (that fetch has ended); compares 8 fragment states at a time. */
static int any_complete(const fetch_t *f, Py_ssize_t nf, const uint8_t *touched) {
    const uint64_t all = 0x0101010101010101ULL * PRESENT;
    for (Py_ssize_t i = 0; i < nf; i++) {
        if (!touched[i]) {
            continue;
        }
        const uint8_t *s = f[i].frag;
        Py_ssize_t n = f[i].nfrag, k = 0;
        uint64_t w;
        while (k + 8 <= n && (memcpy(&w, s + k, 8), w == all)) {
            k += 8;
        }
        while (k < n && s[k] == PRESENT) {
            k++;
        }
        if (k == n) {
            return 1;
        }
    }
    return 0;
}

/* The batch loop that recv_fetch and recv_fetches share: checks the shared buffers, receives
 * recvmmsg() batches (another while the last was full, up to MAX_ROUNDS, until a datagram goes
 * to the slow list, a fetch is complete or the events buffer could not hold another batch's)
 * and hands each DATA to the fetch (of f[0..nf)) whose tenant and key it names (take_data);
 * everything else goes to the slow list. With one fetch, payloads are
 * received in place where predicted (plan_scatter): those DATA are taken first, checked where
 * they lie, then the rest in arrival order. `who` names the caller in errors.
 * Returns (events_written, slow_list, foreign, would_block), or NULL with an exception set. */
static PyObject *recv_batch_into(const char *who, int fd, Py_buffer *rx, Py_ssize_t slot,
                                 int check_src, PyObject *trusted, int kvp_port, int version_op,
                                 int my_group, int frag_bytes, const fetch_t *f, Py_ssize_t nf,
                                 Py_buffer *events) {
    if (slot <= KVP_HDR || rx->len < slot * MAX_BATCH || frag_bytes <= 0 ||
        events->len < (Py_ssize_t)(MAX_BATCH * EVENT_FIELDS * 8) || nf > MAX_FETCHES) {
        PyErr_Format(PyExc_ValueError, "%s: a buffer is too small or too many fetches", who);
        return NULL;
    }
    uint32_t tip[16];
    uint16_t tport[16];
    Py_ssize_t ntrusted = parse_trusted(trusted, tip, tport);
    if (ntrusted < 0) {
        return NULL;
    }
    PyObject *slow = PyList_New(0);
    if (slow == NULL) {
        return NULL;
    }
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    struct iovec iov3[MAX_BATCH][3];
    struct sockaddr_in src[MAX_BATCH];
    long pfirst[MAX_BATCH], pbytes[MAX_BATCH];
    uint8_t in_place[MAX_BATCH];
    int scatter = nf == 1;
    Py_ssize_t ev_cap = events->len / (Py_ssize_t)(EVENT_FIELDS * 8);
    long foreign = 0;
    int nev = 0, drained = 0;
    uint8_t touched[MAX_FETCHES];
    for (int round = 0;; round++) {
        memset(touched, 0, sizeof(touched));
        batch_slots(msgs, iov, src, rx->buf, slot);
        if (scatter) {
            plan_scatter(&f[0], frag_bytes, msgs, iov3, rx->buf, slot, pfirst, pbytes);
        }
        int would_block;
        int got = recv_batch(fd, msgs, &would_block);
        if (got < 0) {
            Py_DECREF(slow);
            return NULL;
        }
        long batch_k = 0;
        for (int m = 0; m < got; m++) {
            in_place[m] = scatter && settle_slot(&f[0], frag_bytes, version_op, iov[m].iov_base,
                                                 msgs[m].msg_len,
                                                 (msgs[m].msg_hdr.msg_flags & MSG_TRUNC) != 0,
                                                 pfirst[m], pbytes[m], &batch_k);
        }
        if (batch_k > 0) {
            f[0].stream[6] = batch_k;
        }
        /* Pass 0 takes the DATA received in place (their ranges are disjoint and nothing else
         * has written there), pass 1 everything else, which may then only fill what is still
         * missing. */
        for (int pass = 0; pass < 2; pass++) {
            for (int m = 0; m < got; m++) {
                if (in_place[m] != (pass == 0)) {
                    continue;
                }
                uint8_t *d = iov[m].iov_base;
                size_t len = msgs[m].msg_len;
                if (check_src && !source_ok(&src[m], kvp_port, tip, tport, ntrusted)) {
                    foreign++;
                    continue;
                }
                int fast = 0;
                if (!(msgs[m].msg_hdr.msg_flags & MSG_TRUNC) && len >= KVP_HDR) {
                    uint64_t key = be64(d + 8);
                    int tenant = be16(d + 4);
                    for (Py_ssize_t i = 0; i < nf; i++) {
                        if (f[i].key == key && f[i].tenant == tenant) {
                            fast = take_data(&f[i], d, len, version_op, my_group, frag_bytes,
                                             events->buf, &nev, i, in_place[m]);
                            touched[i] |= (uint8_t)fast;
                            break;
                        }
                    }
                }
                if (!fast && in_place[m]) { /* not taken: the slow path gets it whole */
                    memcpy(d + KVP_HDR, f[0].out + pfirst[m] * (long)frag_bytes, len - KVP_HDR);
                }
                if (!fast && append_slow(slow, d, len) < 0) {
                    Py_DECREF(slow);
                    return NULL;
                }
            }
        }
        /* Another batch only while the socket had a full one, nothing waits for Python (a slow
         * datagram, a finished fetch), another batch's events fit, and within MAX_ROUNDS. */
        if (would_block || got < MAX_BATCH) {
            drained = 1;
            break;
        }
        if (round + 1 >= MAX_ROUNDS || PyList_GET_SIZE(slow) > 0 || nev + MAX_BATCH > ev_cap ||
            any_complete(f, nf, touched)) {
            break;
        }
    }
    PyObject *result = Py_BuildValue("iOli", nev, slow, foreign, drained);
    Py_DECREF(slow);
    return result;
}

/* Points f at a fetch's buffers (the tensor's bytes, the fragment states, the owners, the
 * replica counters) and checks their sizes. Returns 0, or -1 with ValueError set. */
static int fetch_buffers(const char *who, fetch_t *f, Py_buffer *out, Py_buffer *frag,
                         Py_buffer *owner, Py_buffer *stream) {
    f->nfrag = frag->len;
    f->out = out->buf;
    f->frag = frag->buf;
    f->owner = owner->buf;
    f->stream = stream->buf;
    if (out->len < f->nbytes || owner->len < f->nfrag * 8 ||
        stream->len < (Py_ssize_t)(STREAM_FIELDS * 8)) {
        PyErr_Format(PyExc_ValueError, "%s: a fetch's buffer is too small", who);
        return -1;
    }
    return 0;
}

/*
 * recv_fetch(fd, rxbuf, slot, check_src, trusted, kvp_port, version_op, tenant, key, get_group,
 *            my_group, crc_seed, nbytes, frag_bytes, rid_base, rids_used, out, frag, owner,
 *            events, stream)
 *   -> (events_written, slow_list, foreign, would_block)
 *
 * rxbuf: a writable buffer of MAX_BATCH * slot bytes, reused between calls.
 * trusted: a tuple of (ipv4 as host-order int, port) the source may be besides kvp_port (only
 *     checked when check_src).
 * out: the tensor's bytes (writable); frag: the per-fragment state bytearray; owner: one
 *     uint64 per fragment, the request id that last asked for it.
 * events: a writable int64 buffer of at least MAX_BATCH * EVENT_FIELDS (a call takes another
 *     recvmmsg batch only while the buffer has room for its events: MAX_ROUNDS batches need
 *     MAX_ROUNDS times that); per fast-path DATA that
 *     answers one of our GETs: rid, first, last, new fragments, flags, crc_ok (1/0), 0 (the
 *     fetch's index, as in recv_fetches). A pool DATA (not HIT) with a good CRC and new
 *     fragments that continues the previous event's GET where it ended (first == its last,
 *     same flags) extends that event instead (last, new fragments added).
 * Replicas of our group need no per-GET bookkeeping: they are only counted, in `stream`, a
 *     writable int64 buffer of STREAM_FIELDS: new fragments served from SRAM (HIT), new
 *     fragments from a pool, replicas that brought nothing new, replicas failing their CRC,
 *     and one past the highest fragment a replica with a good CRC carried; then what the call
 *     learned for receiving in place (plan_scatter), kept between calls: the fragment after
 *     the last DATA received, and the most fragments a DATA of the last batch carried (the
 *     caller may seed it; below SCATTER_MIN_FRAGS nothing is received in place).
 * Every datagram that is not such a DATA (NACK, another chunk, anything odd, a DATA whose
 * range or owner does not match) is returned as bytes in slow_list, for the Python path.
 */
static PyObject *py_recv_fetch(PyObject *self, PyObject *args) {
    int fd, check_src, kvp_port, version_op, my_group, frag_bytes;
    fetch_t f;
    Py_ssize_t slot;
    Py_buffer rx, out, frag, owner, events, stream;
    PyObject *trusted;
    if (!PyArg_ParseTuple(args, "iw*niO!iiiKiiIniIIw*w*w*w*w*", &fd, &rx, &slot, &check_src,
                          &PyTuple_Type, &trusted, &kvp_port, &version_op, &f.tenant, &f.key,
                          &f.get_group, &my_group, &f.crc_seed, &f.nbytes, &frag_bytes,
                          &f.rid_base, &f.rids_used, &out, &frag, &owner, &events, &stream)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (fetch_buffers("recv_fetch", &f, &out, &frag, &owner, &stream) == 0) {
        result = recv_batch_into("recv_fetch", fd, &rx, slot, check_src, trusted, kvp_port,
                                 version_op, my_group, frag_bytes, &f, 1, &events);
    }
    PyBuffer_Release(&rx);
    PyBuffer_Release(&out);
    PyBuffer_Release(&frag);
    PyBuffer_Release(&owner);
    PyBuffer_Release(&events);
    PyBuffer_Release(&stream);
    return result;
}

/*
 * recv_fetches(fd, rxbuf, slot, check_src, trusted, kvp_port, version_op, my_group, frag_bytes,
 *              fetches, events)
 *   -> (events_written, slow_list, foreign, would_block)
 *
 * recv_fetch for several fetches in progress on one socket at once (a window of chunks):
 * `fetches` is a tuple of up to MAX_FETCHES tuples (tenant, key, get_group, crc_seed, nbytes,
 * rid_base, rids_used, out, frag, owner, stream), one per fetch, as recv_fetch takes them. A
 * DATA goes to the fetch whose tenant and key it names (each fetch's own request ids, range,
 * owner and CRC checks as in recv_fetch); an event's last field is the index of its fetch in
 * `fetches`. Everything else comes back as bytes in slow_list.
 */
static PyObject *py_recv_fetches(PyObject *self, PyObject *args) {
    int fd, check_src, kvp_port, version_op, my_group, frag_bytes;
    Py_ssize_t slot;
    Py_buffer rx, events;
    PyObject *trusted, *fetches;
    if (!PyArg_ParseTuple(args, "iw*niO!iiiiO!w*", &fd, &rx, &slot, &check_src, &PyTuple_Type,
                          &trusted, &kvp_port, &version_op, &my_group, &frag_bytes,
                          &PyTuple_Type, &fetches, &events)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(fetches);
    Py_ssize_t held = 0;
    fetch_t f[MAX_FETCHES];
    Py_buffer bufs[MAX_FETCHES][4];
    if (nf > MAX_FETCHES) {
        PyErr_SetString(PyExc_ValueError, "recv_fetches: too many fetches");
        goto done;
    }
    for (; held < nf; held++) {
        fetch_t *g = &f[held];
        Py_buffer *b = bufs[held];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fetches, held), "iKiInIIw*w*w*w*", &g->tenant,
                              &g->key, &g->get_group, &g->crc_seed, &g->nbytes, &g->rid_base,
                              &g->rids_used, &b[0], &b[1], &b[2], &b[3])) {
            goto done;
        }
        if (fetch_buffers("recv_fetches", g, &b[0], &b[1], &b[2], &b[3]) < 0) {
            held++;
            goto done;
        }
    }
    result = recv_batch_into("recv_fetches", fd, &rx, slot, check_src, trusted, kvp_port,
                             version_op, my_group, frag_bytes, f, nf, &events);
done:
    for (Py_ssize_t i = 0; i < held; i++) {
        for (int k = 0; k < 4; k++) {
            PyBuffer_Release(&bufs[i][k]);
        }
    }
    PyBuffer_Release(&rx);
    PyBuffer_Release(&events);
    return result;
}

/* ------------------------------------------------------------------ send_batch, send_data */

#define SEND_BATCH 256
/* The most UDP payload one GSO message carries: an IPv4 datagram's 65,535 bytes less the IP
 * and UDP headers. */
#define GSO_MAX_BYTES (65535 - 20 - 8)
/* The most segments one GSO message may have (the kernel's UDP_MAX_SEGMENTS since 4.18). */
#define GSO_MAX_SEGMENTS 64
#define SEND_WAIT_MS 100

/* sendmmsg() of msgs[0..k) (call without the GIL). A full send buffer is waited on for up to
 * SEND_WAIT_MS (as the Python path's socket timeout does); a message the kernel still would
 * not take ends the call. Adds the bytes sent to *sent; returns 0, or the errno that stopped
 * it. */
static int send_msgs(int fd, struct mmsghdr *msgs, Py_ssize_t k, long long *sent) {
    Py_ssize_t done_n = 0;
    int err = 0;
    while (done_n < k) {
        int r = sendmmsg(fd, msgs + done_n, (unsigned int)(k - done_n), 0);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd pfd = {fd, POLLOUT, 0};
                if (poll(&pfd, 1, SEND_WAIT_MS) > 0) {
                    continue;
                }
            }
            err = errno ? errno : EAGAIN;
            break;
        }
        done_n += r;
    }
    for (Py_ssize_t i = 0; i < done_n; i++) {
        *sent += msgs[i].msg_len;
    }
    return err;
}

/* Fills in the destination of a send. */
static void ipv4_to(struct sockaddr_in *to, unsigned long ip, int port) {
    memset(to, 0, sizeof(*to));
    to->sin_family = AF_INET;
    to->sin_port = htons((uint16_t)port);
    to->sin_addr.s_addr = htonl((uint32_t)ip);
}

/* The result of a send: the bytes sent, or OSError when an error stopped it before any. */
static PyObject *send_result(long long sent, int err) {
    if (err && sent == 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLongLong(sent);
}

/*
 * send_batch(fd, (ipv4 host-order int, port), [(header, payload), ...]) -> bytes sent
 * One sendmmsg() per 256 messages (send_msgs: a full send buffer is waited on for up to
 * SEND_WAIT_MS); a message the kernel still would not take ends the call: the bytes sent so
 * far are returned (OSError when nothing was sent).
 */
static PyObject *py_send_batch(PyObject *self, PyObject *args) {
    int fd, port;
    unsigned long ip;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "i(ki)O", &fd, &ip, &port, &seq)) {
        return NULL;
    }
    PyObject *fast = PySequence_Fast(seq, "send_batch: messages must be a sequence");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    struct sockaddr_in to;
    ipv4_to(&to, ip, port);
    long long sent = 0;
    int err = 0;
    Py_buffer bufs[SEND_BATCH][2];
    struct mmsghdr msgs[SEND_BATCH];
    struct iovec iov[SEND_BATCH][2];
    for (Py_ssize_t start = 0; start < n && !err; start += SEND_BATCH) {
        Py_ssize_t k = n - start < SEND_BATCH ? n - start : SEND_BATCH;
        Py_ssize_t held = 0;
        int bad = 0;
        for (; held < k; held++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(fast, start + held);
            PyObject *h, *p;
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                PyErr_SetString(PyExc_TypeError, "send_batch: each message is (header, payload)");
                bad = 1;
                break;
            }
            h = PyTuple_GET_ITEM(pair, 0);
            p = PyTuple_GET_ITEM(pair, 1);
            if (PyObject_GetBuffer(h, &bufs[held][0], PyBUF_SIMPLE) < 0) {
                bad = 1;
                break;
            }
            if (PyObject_GetBuffer(p, &bufs[held][1], PyBUF_SIMPLE) < 0) {
                PyBuffer_Release(&bufs[held][0]);
                bad = 1;
                break;
            }
            iov[held][0].iov_base = bufs[held][0].buf;
            iov[held][0].iov_len = (size_t)bufs[held][0].len;
            iov[held][1].iov_base = bufs[held][1].buf;
            iov[held][1].iov_len = (size_t)bufs[held][1].len;
            memset(&msgs[held].msg_hdr, 0, sizeof(msgs[held].msg_hdr));
            msgs[held].msg_hdr.msg_name = &to;
            msgs[held].msg_hdr.msg_namelen = sizeof(to);
            msgs[held].msg_hdr.msg_iov = iov[held];
            msgs[held].msg_hdr.msg_iovlen = 2;
        }
        if (!bad) {
            Py_BEGIN_ALLOW_THREADS
            err = send_msgs(fd, msgs, k, &sent);
            Py_END_ALLOW_THREADS
        }
        for (Py_ssize_t i = 0; i < held; i++) {
            PyBuffer_Release(&bufs[i][0]);
            PyBuffer_Release(&bufs[i][1]);
        }
        if (bad) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    return send_result(sent, err);
}

static inline void put16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}
static inline void put32(uint8_t *p, uint32_t v) {
    put16(p, v >> 16);
    put16(p + 2, v & 0xFFFF);
}

/*
 * send_data(fd, (ipv4 host-order int, port), header, chunk, first, end, frags_per_data,
 *           frag_bytes, crcs=None, gso=0) -> bytes sent
 *
 * A pool node's answer to GET(first .. end-1) in C: fragments [first, end) of `chunk`, at most
 * frags_per_data per DATA, each DATA the 40-byte `header` (the caller packs everything that is
 * the same for the whole answer: version and op, flags, status, tenant, group, key, request id,
 * frag_count) with frag_idx (offset 24), payload_len (28) and crc (36) filled in per DATA: the
 * CRC-32 of the payload seeded with tenant | key | frag_idx, as kvcast.wire.fragment_crc. The
 * bytes on the wire are exactly the Python path's (KvpGetHandler.data_replies); a test compares
 * them. Sent with one sendmmsg() per 256 DATAs, as send_batch. ValueError for a range outside
 * the chunk or past fragment 65535 (frag_idx is 16 bits on the wire).
 *
 * crcs: None, or a writable buffer of 8 bytes per fragment of the chunk that keeps, per
 * fragment i, the CRC of the last DATA sent starting at i and that DATA's payload_len + 1
 * (0: none yet), two native-endian uint32 (crc_slots in poolnode.server). A DATA with the same
 * start and length takes its CRC from there instead of computing it: a pool node that serves
 * the same ranges of a chunk to many hosts computes each CRC once. The caller keeps the buffer
 * with the chunk's bytes it was filled from (poolnode.server.ChunkCache).
 *
 * gso > 1: consecutive DATAs of one size (at most gso, at most 64, at most 65,507 bytes, a
 * shorter one last) leave as one UDP GSO message (UDP_SEGMENT set to the DATA size): the
 * receiver gets the same datagrams, and the stack is crossed once per message instead of once
 * per DATA. Only for a path that segments GSO packets before anything reads raw frames (a NIC,
 * loopback); a software switch reading a veth with a packet socket would see one giant frame.
 */
static PyObject *py_send_data(PyObject *self, PyObject *args) {
    (void)self;
    int fd, port, frags_per_data, frag_bytes;
    unsigned long ip;
    long first, end;
    Py_buffer hdr, chunk, table;
    PyObject *crcs = Py_None;
    int gso = 0;
    if (!PyArg_ParseTuple(args, "i(ki)y*y*llii|Oi", &fd, &ip, &port, &hdr, &chunk, &first, &end,
                          &frags_per_data, &frag_bytes, &crcs, &gso)) {
        return NULL;
    }
    PyObject *result = NULL;
    table.obj = NULL;
    long nfrag = frag_bytes > 0 ? (long)((chunk.len + frag_bytes - 1) / frag_bytes) : 0;
    if (crcs != Py_None) {
        if (PyObject_GetBuffer(crcs, &table, PyBUF_WRITABLE) < 0) {
            goto done;
        }
        if (table.len < nfrag * 8) {
            PyErr_SetString(PyExc_ValueError, "send_data: crcs holds fewer than 8 bytes a fragment");
            goto done;
        }
    }
    if (gso > GSO_MAX_SEGMENTS) {
        gso = GSO_MAX_SEGMENTS;
    }
    uint8_t *slots = table.obj != NULL ? table.buf : NULL;
    if (hdr.len != KVP_HDR || frag_bytes <= 0 || frags_per_data <= 0 ||
        (long)frags_per_data * frag_bytes > 0xFFFF || first < 0 || first >= end ||
        end > nfrag || end > 0x10000) {
        PyErr_SetString(PyExc_ValueError,
                        "send_data: the header is not 40 bytes or the range is outside the chunk "
                        "(or beyond a 16-bit fragment index)");
        goto done;
    }
    const uint8_t *h = hdr.buf;
    const uint8_t *data = chunk.buf;
    size_t size = (size_t)chunk.len;
    uint8_t ident[10]; /* tenant (16) | key (64): the chunk's part of every CRC seed */
    memcpy(ident, h + 4, 2);
    memcpy(ident + 2, h + 8, 8);
    struct sockaddr_in to;
    ipv4_to(&to, ip, port);
    long long sent = 0;
    int err = 0;
    uint8_t headers[SEND_BATCH][KVP_HDR];
    struct mmsghdr msgs[SEND_BATCH];
    struct iovec iov[SEND_BATCH][2];
    size_t dlen[SEND_BATCH];
    union { /* a control buffer aligned for its cmsghdr */
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } ctl[SEND_BATCH];
    Py_BEGIN_ALLOW_THREADS
    uint32_t seed = crc32_update(0, ident, sizeof(ident));
    long at = first;
    while (at < end && !err) {
        Py_ssize_t k = 0;
        for (; k < SEND_BATCH && at < end; k++) {
            long last = at + frags_per_data < end ? at + frags_per_data : end;
            size_t lo = (size_t)at * (size_t)frag_bytes;
            size_t hi = (size_t)last * (size_t)frag_bytes;
            if (hi > size) {
                hi = size;
            }
            uint8_t *o = headers[k];
            memcpy(o, h, KVP_HDR);
            put16(o + 24, (unsigned)at);
            put16(o + 28, (unsigned)(hi - lo));
            uint32_t crc, tag = (uint32_t)(hi - lo) + 1, held = 0;
            uint8_t *slot = slots != NULL ? slots + (size_t)at * 8 : NULL;
            if (slot != NULL) {
                memcpy(&held, slot, 4);
            }
            if (slot != NULL && held == tag) {
                memcpy(&crc, slot + 4, 4);
            } else {
                crc = crc32_update(crc32_tables(seed, o + 24, 2), data + lo, hi - lo);
                if (slot != NULL) {
                    memcpy(slot, &tag, 4);
                    memcpy(slot + 4, &crc, 4);
                }
            }
            put32(o + 36, crc);
            iov[k][0].iov_base = o;
            iov[k][0].iov_len = KVP_HDR;
            iov[k][1].iov_base = (void *)(data + lo);
            iov[k][1].iov_len = hi - lo;
            dlen[k] = KVP_HDR + (hi - lo);
            at = last;
        }
        /* One message per DATA; with gso > 1, up to gso consecutive DATAs of one size (the
         * last of a message may be shorter) go as one UDP GSO message (UDP_SEGMENT): the
         * kernel, or the NIC, cuts it into exactly the datagrams that would have been sent
         * one by one, and the stack is crossed once for all of them. */
        Py_ssize_t nm = 0;
        for (Py_ssize_t d = 0; d < k; nm++) {
            Py_ssize_t e = d + 1;
            size_t total = dlen[d];
            if (gso > 1) {
                while (e < k && e - d < gso && dlen[e] <= dlen[d] &&
                       total + dlen[e] <= GSO_MAX_BYTES) {
                    total += dlen[e];
                    e++;
                    if (dlen[e - 1] < dlen[d]) {
                        break; /* a shorter DATA ends a message */
                    }
                }
            }
            struct msghdr *mh = &msgs[nm].msg_hdr;
            memset(mh, 0, sizeof(*mh));
            mh->msg_name = &to;
            mh->msg_namelen = sizeof(to);
            mh->msg_iov = iov[d];
            mh->msg_iovlen = (size_t)(2 * (e - d));
            if (e - d > 1) {
                mh->msg_control = ctl[nm].buf;
                mh->msg_controllen = sizeof(ctl[nm].buf);
                struct cmsghdr *cm = CMSG_FIRSTHDR(mh);
                cm->cmsg_level = SOL_UDP;
                cm->cmsg_type = UDP_SEGMENT;
                cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t seg = (uint16_t)dlen[d];
                memcpy(CMSG_DATA(cm), &seg, sizeof(seg));
            }
            d = e;
        }
        err = send_msgs(fd, msgs, nm, &sent);
    }
    Py_END_ALLOW_THREADS
    result = send_result(sent, err);
done:
    if (table.obj != NULL) {
        PyBuffer_Release(&table);
    }
    PyBuffer_Release(&hdr);
    PyBuffer_Release(&chunk);
    return result;
}

/*
 * send_gets(fd, buf, slot, count) -> messages handled
 *
 * An agent's GETs that are due at once, in one sendmmsg() on a connected socket (fd): message
 * q is bytes [q*slot, (q+1)*slot) of buf, at most SEND_BATCH of them. Never waits: a full send
 * buffer (EAGAIN) stops the call, and the result says how many messages went out before it,
 * so the caller asks for the rest again later. A message the kernel refuses with another error
 * (an ICMP error of an earlier GET reported on this one) counts as handled, as the Python path
 * does: its timeout retries it.
 */
static PyObject *py_send_gets(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    Py_ssize_t slot, count;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iy*nn", &fd, &buf, &slot, &count)) {
        return NULL;
    }
    if (slot <= 0 || count < 0 || count > SEND_BATCH || count * slot > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "send_gets: count or slot outside the buffer");
        return NULL;
    }
    struct mmsghdr msgs[SEND_BATCH];
    struct iovec iov[SEND_BATCH];
    for (Py_ssize_t q = 0; q < count; q++) {
        iov[q].iov_base = (uint8_t *)buf.buf + q * slot;
        iov[q].iov_len = (size_t)slot;
        memset(&msgs[q].msg_hdr, 0, sizeof(msgs[q].msg_hdr));
        msgs[q].msg_hdr.msg_iov = &iov[q];
        msgs[q].msg_hdr.msg_iovlen = 1;
    }
    Py_ssize_t done_n = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done_n < count) {
        int r = sendmmsg(fd, msgs + done_n, (unsigned int)(count - done_n), MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            }
            done_n++; /* refused by the network, not by a full buffer: its timeout retries it */
            continue;
        }
        done_n += r;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(done_n);
}

/* ------------------------------------------------------------------ recv_datagrams */

/*
 * recv_datagrams(fd, rxbuf, slot) -> [(length, ipv4 host-order int, port), ...]
 *
 * A pool node's GETs, one recvmmsg() for up to MAX_BATCH of them (MSG_DONTWAIT; an empty list
 * when none is queued): datagram m is bytes [m*slot, m*slot + length) of rxbuf. slot must be
 * at least 65536, so no UDP datagram is ever cut short (a datagram is what recvfrom would
 * give). ValueError when rxbuf holds fewer than MAX_BATCH slots; OSError for a socket error
 * other than "nothing queued" (an ICMP error reported on the socket is skipped, as recvfrom's
 * caller does).
 */
static PyObject *py_recv_datagrams(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    Py_ssize_t slot;
    Py_buffer rx;
    if (!PyArg_ParseTuple(args, "iw*n", &fd, &rx, &slot)) {
        return NULL;
    }
    if (slot < 65536 || rx.len < slot * MAX_BATCH) {
        PyBuffer_Release(&rx);
        PyErr_SetString(PyExc_ValueError,
                        "recv_datagrams: slot below 65536 or rxbuf holds fewer than MAX_BATCH");
        return NULL;
    }
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    struct sockaddr_in src[MAX_BATCH];
    batch_slots(msgs, iov, src, rx.buf, slot);
    int would_block;
    int got = recv_batch(fd, msgs, &would_block);
    PyBuffer_Release(&rx);
    if (got < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(got);
    if (out == NULL) {
        return NULL;
    }
    for (int m = 0; m < got; m++) {
        PyObject *t = Py_BuildValue("(IkH)", msgs[m].msg_len,
                                    (unsigned long)ntohl(src[m].sin_addr.s_addr),
                                    ntohs(src[m].sin_port));
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, m, t);
    }
    return out;
}

/* ------------------------------------------------------------------ recv_count */

/*
 * recv_count(fd, rxbuf, slot, count, timeout_ms) -> (datagrams, bytes)
 * The machine's receive ceiling for benchmarks: recvmmsg() until `count` datagrams arrived (or
 * nothing arrived for timeout_ms), touching nothing but the lengths.
 */
static PyObject *py_recv_count(PyObject *self, PyObject *args) {
    (void)self;
    int fd, timeout_ms;
    Py_ssize_t slot, count;
    Py_buffer rx;
    if (!PyArg_ParseTuple(args, "iw*nni", &fd, &rx, &slot, &count, &timeout_ms)) {
        return NULL;
    }
    if (slot <= 0 || rx.len < slot * MAX_BATCH) {
        PyBuffer_Release(&rx);
        PyErr_SetString(PyExc_ValueError, "recv_count: rxbuf holds fewer than MAX_BATCH slots");
        return NULL;
    }
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    batch_slots(msgs, iov, NULL, rx.buf, slot);
    Py_ssize_t got = 0;
    long long bytes = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (got < count) {
        int r = recvmmsg(fd, msgs, MAX_BATCH, MSG_DONTWAIT, NULL);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd pfd = {fd, POLLIN, 0};
                if (poll(&pfd, 1, timeout_ms) > 0) {
                    continue;
                }
                break;
            }
            err = errno;
            break;
        }
        for (int i = 0; i < r; i++) {
            bytes += msgs[i].msg_len;
        }
        got += r;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&rx);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("nL", got, bytes);
}

/* ------------------------------------------------------------------ module */

static PyObject *py_crc_impl(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#ifdef HAVE_CLMUL_PATH
    if (have_vclmul) {
        return PyUnicode_FromString("vpclmul");
    }
    if (have_clmul) {
        return PyUnicode_FromString("pclmul");
    }
#endif
    return PyUnicode_FromString(zlib_crc32 != NULL ? "zlib" : "tables");
}

/* crc32_with(impl, data, value=0): one CRC-32 implementation by name, for the tests that
 * compare each with zlib ('vpclmul' and 'pclmul' only where the processor has them). */
static PyObject *py_crc32_with(PyObject *self, PyObject *args) {
    (void)self;
    const char *impl;
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "sy*|I", &impl, &data, &value)) {
        return NULL;
    }
    const uint8_t *p = data.buf;
    size_t n = (size_t)data.len;
    uint32_t crc;
    if (strcmp(impl, "tables") == 0) {
        crc = crc32_tables(value, p, n);
#ifdef HAVE_CLMUL_PATH
    } else if (strcmp(impl, "pclmul") == 0 && have_clmul) {
        crc = n >= 64 ? crc32_clmul(value, p, n) : crc32_tables(value, p, n);
    } else if (strcmp(impl, "vpclmul") == 0 && have_vclmul) {
        crc = n >= 128 ? crc32_vclmul(value, p, n) : crc32_tables(value, p, n);
#endif
    } else {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "crc32_with: %s is not available here", impl);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"crc_impl", py_crc_impl, METH_NOARGS, "crc_impl(): 'vpclmul', 'pclmul', 'zlib' (libz) or 'tables'."},
    {"crc32_with", py_crc32_with, METH_VARARGS,
     "crc32_with(impl, data, value=0): CRC-32 by 'tables', 'pclmul' or 'vpclmul' (tests)."},
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0): zlib's CRC-32, continued from value."},
    {"recv_fetch", py_recv_fetch, METH_VARARGS,
     "Receive a batch of datagrams for one fetch (see kvcast/_native.c)."},
    {"recv_fetches", py_recv_fetches, METH_VARARGS,
     "Receive a batch of datagrams for several fetches at once (see kvcast/_native.c)."},
    {"recv_datagrams", py_recv_datagrams, METH_VARARGS,
     "recv_datagrams(fd, rxbuf, slot): one recvmmsg of up to MAX_BATCH datagrams, each "
     "(length, ipv4 int, port) at m*slot of rxbuf."},
    {"recv_count", py_recv_count, METH_VARARGS,
     "recv_count(fd, rxbuf, slot, count, timeout_ms): receive count datagrams, touch nothing."},
    {"send_batch", py_send_batch, METH_VARARGS,
     "send_batch(fd, (ip, port), [(header, payload), ...]): sendmmsg, returns bytes sent."},
    {"send_gets", py_send_gets, METH_VARARGS,
     "send_gets(fd, buf, slot, count): count slot-byte messages of buf in one sendmmsg on a "
     "connected socket, never waiting; returns how many were handled."},
    {"send_data", py_send_data, METH_VARARGS,
     "send_data(fd, (ip, port), header, chunk, first, end, frags_per_data, frag_bytes, "
     "crcs=None, gso=0): a pool node's DATAs for fragments [first, end), headers and CRCs "
     "built here (kept in crcs when given), up to gso DATAs per UDP GSO message; bytes sent."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvcast._native",
    "The host data path's per-datagram work in C (recvmmsg, sendmmsg, CRC-32).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
#ifdef HAVE_CLMUL_PATH
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    have_vclmul = have_clmul && __builtin_cpu_supports("vpclmulqdq") &&
                  __builtin_cpu_supports("avx2");
#endif
    void *libz = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (libz != NULL) {
        zlib_crc32 = (zlib_crc32_t)dlsym(libz, "crc32");
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_BATCH", MAX_BATCH) < 0 ||
        PyModule_AddIntConstant(m, "MAX_ROUNDS", MAX_ROUNDS) < 0 ||
        PyModule_AddIntConstant(m, "SEND_BATCH", SEND_BATCH) < 0 ||
        PyModule_AddIntConstant(m, "EVENT_FIELDS", EVENT_FIELDS) < 0 ||
        PyModule_AddIntConstant(m, "STREAM_FIELDS", STREAM_FIELDS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_FETCHES", MAX_FETCHES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
