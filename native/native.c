/*
 * wakustore._native: the per-message loops of a hydrating member, in C.
 *
 * decode_status_go(body, topic_keys, default_pubsub)
 *     The records of a status-go archive body decoded into the columns of
 *     the messages table, as protocols.archive_records.RecordDecoder.decode
 *     reads them one at a time: payloads sealed again with their channel
 *     key (AES-GCM), the message hash rebuilt and checked, MUIDs and
 *     digests computed. Only the plain form is read here: every record's
 *     fields known, each at most once, with its own wire type, values that
 *     fit the table's columns. For anything else it returns None and the
 *     caller decodes the archive with the reference decoder, which says
 *     what is wrong with it; a test holds the two equal.
 *
 * bloom_add(bits, words, probes) / bloom_test(bits, words, probes)
 *     storage.key_filter's double hashing over a bit array, a key at a time.
 *
 * find_keys(runs, keys, width)
 *     Where each of ``keys`` (sorted, ``width`` bytes each) stands in each
 *     of ``runs`` (buffers of sorted ``width``-byte keys: the key sections
 *     of storage.index_files, mapped from disk): one call for a lookup
 *     over every data file, where numpy took ~10 us a file.
 *
 * encode_entries(form, count, order, columns...)
 *     A Store page's rows, column by column as Arrow holds them and in
 *     the order given (positions: no take of the rows first), written
 *     as the protobuf fields of a StoreQueryResponse (messages = 20) or a
 *     legacy HistoryResponse (messages = 2), byte for byte what the
 *     protobuf runtime writes for the same rows (a test holds the two
 *     equal): the read path answers in Arrow until here.
 *
 * Python objects are made only at the start and the end of a call; the
 * loops over records run without the GIL.
 */

#define PY_SSIZE_T_CLEAN
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <string.h>

#define WIRE_VARINT 0
#define WIRE_I64 1
#define WIRE_LEN 2
#define WIRE_I32 5

#define NONCE_SIZE 12
#define TAG_SIZE 16
#define TOPIC_SIZE 4
#define FLAG_SIGNED 0x04
#define MUID_META_PART 32
#define NS_PER_S 1000000000ULL
#define MAX_UNIQUE 4096

/* Fields of a status-go archive record (protos/archive_status_go.proto). */
enum {
    F_SIG, F_SECONDS, F_TOPIC, F_PAYLOAD, F_PADDING, F_HASH, F_THIRD_PARTY,
    F_TIMESTAMP_NS, F_PUBSUB, F_META, F_VERSION, F_ARRIVAL, F_PROOF, F_NONCE, F_SIGNATURE,
    F_COUNT
};

typedef struct {
    const uint8_t *ptr;
    Py_ssize_t len;
} span;

typedef struct {
    span bytes[F_COUNT];
    uint64_t ints[F_COUNT];
    uint32_t present;
    int32_t topic;   /* index into the unique topics */
    int32_t pubsub;  /* index into the unique pubsub topics; -1: the default */
    Py_ssize_t payload_len;  /* of the payload as stored (sealed or not) */
    int64_t sender, arrival;
} record;

typedef struct {
    span value;
    EVP_CIPHER_CTX *cipher;  /* topics only: NULL when no key */
    char content[32];        /* topics only: /waku/1/0x<hex>/rfc26 */
    Py_ssize_t content_len;
} unique;

static inline int read_varint(const uint8_t **pos, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pos;
    if (p < end && *p < 0x80) {  /* most keys and lengths */
        *out = *p;
        *pos = p + 1;
        return 0;
    }
    uint64_t value = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end)
            return -1;
        uint8_t byte = *p++;
        if (i == 9 && byte > 1)
            return -1;  /* past 64 bits */
        value |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *pos = p;
            *out = value;
            return 0;
        }
    }
    return -1;
}

/* The field index of a record's field number with its wire type, -1 for
 * anything this decoder leaves to the reference one. */
static int field_of(uint64_t number, int wire)
{
    static const int low_wire[8] = {-1, WIRE_LEN, WIRE_VARINT, WIRE_LEN, WIRE_LEN, WIRE_LEN, WIRE_LEN, WIRE_LEN};
    static const int ext_wire[9] = {-1, WIRE_VARINT, WIRE_LEN, WIRE_LEN, WIRE_VARINT, WIRE_VARINT, WIRE_LEN,
                                    WIRE_LEN, WIRE_LEN};
    if (number >= 1 && number <= 7)
        return low_wire[number] == wire ? (int)number - 1 : -1;
    if (number >= 1001 && number <= 1008)
        return ext_wire[number - 1000] == wire ? F_TIMESTAMP_NS + (int)(number - 1001) : -1;
    return -1;
}

static int parse_record(const uint8_t *p, const uint8_t *end, record *r)
{
    memset(r, 0, sizeof(*r));
    while (p < end) {
        uint64_t key, value;
        if (read_varint(&p, end, &key))
            return -1;
        int wire = (int)(key & 7);
        int field = field_of(key >> 3, wire);
        if (field < 0 || r->present & (1u << field))
            return -1;
        r->present |= 1u << field;
        if (read_varint(&p, end, &value))
            return -1;
        if (wire == WIRE_LEN) {
            if (value > (uint64_t)(end - p))
                return -1;
            r->bytes[field].ptr = p;
            r->bytes[field].len = (Py_ssize_t)value;
            p += value;
        } else {
            r->ints[field] = value;
        }
    }
    return 0;
}

static int find_unique(unique *uniques, int *count, const uint8_t *ptr, Py_ssize_t len)
{
    for (int i = *count - 1; i >= 0; i--)
        if (uniques[i].value.len == len && memcmp(uniques[i].value.ptr, ptr, (size_t)len) == 0)
            return i;
    if (*count >= MAX_UNIQUE)
        return -1;
    uniques[*count].value.ptr = ptr;
    uniques[*count].value.len = len;
    return (*count)++;
}

static int size_field_length(Py_ssize_t size)
{
    int n = 1;
    while ((uint64_t)size >> (8 * n) && n < 8)
        n++;
    return n;
}

#define HAS(r, f) ((r)->present & (1u << (f)))

/* Checks of RecordDecoder._rebuild; fills sender, arrival, payload_len. */
static int check_record(record *r, unique *topics, int *topic_count, unique *pubsubs, int *pubsub_count)
{
    if (!HAS(r, F_TOPIC) || r->bytes[F_TOPIC].len != TOPIC_SIZE)
        return -1;
    if (HAS(r, F_THIRD_PARTY) && r->bytes[F_THIRD_PARTY].len)
        return -1;  /* a string field: its UTF-8 is the reference's to check */
    r->topic = find_unique(topics, topic_count, r->bytes[F_TOPIC].ptr, TOPIC_SIZE);
    if (r->topic < 0)
        return -1;
    uint64_t seconds = r->ints[F_SECONDS];
    if (!HAS(r, F_ARRIVAL)) {  /* an archive status-go made */
        if (seconds > (uint64_t)INT64_MAX / NS_PER_S)
            return -1;
        r->pubsub = -1;
        r->sender = r->arrival = (int64_t)(seconds * NS_PER_S);
        r->payload_len = r->bytes[F_PAYLOAD].len;
        r->bytes[F_META].len = r->bytes[F_PROOF].len = 0;
        r->ints[F_VERSION] = 0;
        return 0;
    }
    if (!HAS(r, F_PUBSUB))
        return -1;
    r->pubsub = find_unique(pubsubs, pubsub_count, r->bytes[F_PUBSUB].ptr, r->bytes[F_PUBSUB].len);
    if (r->pubsub < 0)
        return -1;
    uint64_t zz = r->ints[F_TIMESTAMP_NS];
    int64_t timestamp = (int64_t)(zz >> 1) ^ -(int64_t)(zz & 1);
    if (timestamp < 0 || r->ints[F_ARRIVAL] > (uint64_t)INT64_MAX || r->ints[F_VERSION] > (uint64_t)INT32_MAX)
        return -1;
    r->sender = timestamp;
    r->arrival = (int64_t)r->ints[F_ARRIVAL];
    uint64_t ordering = timestamp ? (uint64_t)timestamp : (uint64_t)r->arrival;
    if (ordering / NS_PER_S != seconds)
        return -1;
    if (!HAS(r, F_HASH) || r->bytes[F_HASH].len != SHA256_DIGEST_LENGTH)
        return -1;
    if (HAS(r, F_NONCE)) {
        if (r->bytes[F_NONCE].len != NONCE_SIZE)
            return -1;
        Py_ssize_t size = r->bytes[F_PAYLOAD].len;
        r->payload_len = 1 + size_field_length(size) + size + r->bytes[F_PADDING].len + r->bytes[F_SIGNATURE].len
                         + TAG_SIZE + NONCE_SIZE;
    } else {
        r->payload_len = r->bytes[F_PAYLOAD].len;
    }
    return 0;
}

/* Waku v1's symmetric payload sealed with the record's nonce: flags, the
 * size (minimal little-endian), payload, padding, signature; ciphertext,
 * tag, nonce. The plaintext is laid out in ``out`` and encrypted in place,
 * one call (pieces at odd offsets took GCM's byte-at-a-time path). */
static int seal(EVP_CIPHER_CTX *ctx, const record *r, uint8_t *out)
{
    Py_ssize_t size = r->bytes[F_PAYLOAD].len;
    int count = size_field_length(size), written = 0, total = 0;
    uint8_t *at = out;
    *at++ = (uint8_t)(count | (r->bytes[F_SIGNATURE].len ? FLAG_SIGNED : 0));
    for (int i = 0; i < count; i++)
        *at++ = (uint8_t)((uint64_t)size >> (8 * i));
    const span parts[3] = {r->bytes[F_PAYLOAD], r->bytes[F_PADDING], r->bytes[F_SIGNATURE]};
    for (int i = 0; i < 3; i++) {
        if (parts[i].len)
            memcpy(at, parts[i].ptr, (size_t)parts[i].len);
        at += parts[i].len;
    }
    int plain = (int)(at - out);
    if (!EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, r->bytes[F_NONCE].ptr) ||
        !EVP_EncryptUpdate(ctx, out, &written, out, plain))
        return -1;
    total = written;
    if (!EVP_EncryptFinal_ex(ctx, out + total, &written))
        return -1;
    total += written;
    if (!EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_SIZE, out + total))
        return -1;
    memcpy(out + total + TAG_SIZE, r->bytes[F_NONCE].ptr, NONCE_SIZE);
    return 0;
}

static void sha256_parts(uint8_t *out, const span *parts, int count)
{
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    for (int i = 0; i < count; i++)
        if (parts[i].len)
            SHA256_Update(&ctx, parts[i].ptr, (size_t)parts[i].len);
    SHA256_Final(out, &ctx);
}

static const EVP_CIPHER *gcm_for(Py_ssize_t key_len)
{
    switch (key_len) {
    case 16: return EVP_aes_128_gcm();
    case 24: return EVP_aes_192_gcm();
    case 32: return EVP_aes_256_gcm();
    default: return NULL;
    }
}

enum {
    O_PUBSUB_INDEX, O_TOPIC_INDEX, O_PAYLOAD_OFF, O_PAYLOAD, O_META_OFF, O_META, O_PROOF_OFF, O_PROOF,
    O_VERSION, O_SENDER, O_ARRIVAL, O_HASH, O_MUID_OFF, O_MUID, O_DIGEST = O_MUID + 1
};

static PyObject *decode_status_go(PyObject *self, PyObject *args)
{
    Py_buffer body;
    PyObject *topic_keys, *default_pubsub;
    if (!PyArg_ParseTuple(args, "y*O!S", &body, &PyDict_Type, &topic_keys, &default_pubsub))
        return NULL;
    PyObject *result = NULL;
    record *records = NULL;
    unique *topics = NULL, *pubsubs = NULL;
    PyObject *objects[16] = {NULL};
    int topic_count = 0, pubsub_count = 0, failed = 0;
    Py_ssize_t count = 0, capacity = 0;
    const uint8_t *p = body.buf, *end = p + body.len, *metadata = NULL;
    Py_ssize_t metadata_len = 0;

    topics = PyMem_Calloc(MAX_UNIQUE, sizeof(unique));
    pubsubs = PyMem_Calloc(MAX_UNIQUE, sizeof(unique));
    if (!topics || !pubsubs) {
        PyErr_NoMemory();
        goto done;
    }
    /* The archive's fields, as archive._split_archive walks them. */
    while (p < end && !failed) {
        uint64_t key, value;
        if (read_varint(&p, end, &key) || key >> 3 == 0) {
            failed = 1;
            break;
        }
        switch (key & 7) {
        case WIRE_VARINT:
            failed = read_varint(&p, end, &value) != 0;
            break;
        case WIRE_I64:
        case WIRE_I32:
            value = (key & 7) == WIRE_I64 ? 8 : 4;
            if (value > (uint64_t)(end - p))
                failed = 1;
            else
                p += value;
            break;
        case WIRE_LEN:
            if (read_varint(&p, end, &value) || value > (uint64_t)(end - p)) {
                failed = 1;
                break;
            }
            if (key >> 3 == 2) {
                metadata = p;
                metadata_len = (Py_ssize_t)value;
            } else if (key >> 3 == 3) {
                if (count == capacity) {
                    Py_ssize_t grown = capacity ? capacity * 2 : 1024;
                    record *more = PyMem_Realloc(records, (size_t)grown * sizeof(record));
                    if (!more) {
                        PyErr_NoMemory();
                        goto done;
                    }
                    records = more;
                    capacity = grown;
                }
                record *r = &records[count++];
                if (parse_record(p, p + value, r) || check_record(r, topics, &topic_count, pubsubs, &pubsub_count))
                    failed = 1;
            }
            p += value;
            break;
        default:
            failed = 1;
        }
    }
    if (failed || !metadata) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* A key for each topic that has a sealed record. */
    for (Py_ssize_t i = 0; i < count; i++) {
        record *r = &records[i];
        unique *t = &topics[r->topic];
        if (!HAS(r, F_ARRIVAL) || !HAS(r, F_NONCE) || t->cipher)
            continue;
        PyObject *raw = PyBytes_FromStringAndSize((const char *)t->value.ptr, t->value.len);
        if (!raw)
            goto done;
        PyObject *key = PyDict_GetItemWithError(topic_keys, raw);
        Py_DECREF(raw);
        if (!key) {
            if (PyErr_Occurred())
                goto done;
            result = Py_NewRef(Py_None);  /* no key: the reference decoder says so */
            goto done;
        }
        const EVP_CIPHER *gcm = PyBytes_Check(key) ? gcm_for(PyBytes_GET_SIZE(key)) : NULL;
        if (!gcm) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        t->cipher = EVP_CIPHER_CTX_new();
        if (!t->cipher || !EVP_EncryptInit_ex(t->cipher, gcm, NULL, (const uint8_t *)PyBytes_AS_STRING(key), NULL)) {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not set up AES-GCM");
            goto done;
        }
    }
    for (int i = 0; i < topic_count; i++) {
        const uint8_t *v = topics[i].value.ptr;
        topics[i].content_len = snprintf(topics[i].content, sizeof(topics[i].content),
                                         "/waku/1/0x%02x%02x%02x%02x/rfc26", v[0], v[1], v[2], v[3]);
    }
    /* Sizes, then the output buffers. */
    Py_ssize_t payload_bytes = 0, meta_bytes = 0, proof_bytes = 0, muid_bytes = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        record *r = &records[i];
        payload_bytes += r->payload_len;
        meta_bytes += r->bytes[F_META].len;
        proof_bytes += r->bytes[F_PROOF].len;
        muid_bytes += SHA256_DIGEST_LENGTH + (r->bytes[F_META].len < MUID_META_PART ? r->bytes[F_META].len
                                                                                  : MUID_META_PART);
    }
    if (payload_bytes > INT32_MAX || meta_bytes > INT32_MAX || proof_bytes > INT32_MAX || muid_bytes > INT32_MAX) {
        result = Py_NewRef(Py_None);  /* past a binary column's offsets */
        goto done;
    }
    const Py_ssize_t sizes[15] = {
        count * 4, count * 4, (count + 1) * 4, payload_bytes, (count + 1) * 4, meta_bytes, (count + 1) * 4,
        proof_bytes, count * 4, count * 8, count * 8, count * SHA256_DIGEST_LENGTH, (count + 1) * 4, muid_bytes,
        count * SHA256_DIGEST_LENGTH};
    char *out[15];
    for (int i = 0; i < 15; i++) {
        objects[i] = PyBytes_FromStringAndSize(NULL, sizes[i]);
        if (!objects[i])
            goto done;
        out[i] = PyBytes_AS_STRING(objects[i]);
    }
    const span default_span = {(const uint8_t *)PyBytes_AS_STRING(default_pubsub), PyBytes_GET_SIZE(default_pubsub)};
    int32_t payload_at = 0, meta_at = 0, proof_at = 0, muid_at = 0;
    int sealing_failed = 0;
    Py_BEGIN_ALLOW_THREADS
    ((int32_t *)out[O_PAYLOAD_OFF])[0] = ((int32_t *)out[O_META_OFF])[0] = ((int32_t *)out[O_PROOF_OFF])[0] =
        ((int32_t *)out[O_MUID_OFF])[0] = 0;
    for (Py_ssize_t i = 0; i < count && !sealing_failed; i++) {
        record *r = &records[i];
        unique *t = &topics[r->topic];
        span pubsub = r->pubsub < 0 ? default_span : pubsubs[r->pubsub].value;
        span content = {(const uint8_t *)t->content, t->content_len};
        span meta = r->bytes[F_META];
        uint8_t *payload_out = (uint8_t *)out[O_PAYLOAD] + payload_at;
        if (HAS(r, F_ARRIVAL) && HAS(r, F_NONCE)) {
            if (seal(t->cipher, r, payload_out)) {
                sealing_failed = 1;
                break;
            }
        } else if (r->payload_len) {
            memcpy(payload_out, r->bytes[F_PAYLOAD].ptr, (size_t)r->payload_len);
        }
        span payload = {payload_out, r->payload_len};
        uint8_t stamp[8];
        for (int b = 0; b < 8; b++)
            stamp[b] = (uint8_t)((uint64_t)r->sender >> (56 - 8 * b));
        uint8_t *hash = (uint8_t *)out[O_HASH] + i * SHA256_DIGEST_LENGTH;
        const span hashed[5] = {pubsub, payload, content, meta, {stamp, 8}};
        sha256_parts(hash, hashed, 5);
        if (HAS(r, F_ARRIVAL) && memcmp(hash, r->bytes[F_HASH].ptr, SHA256_DIGEST_LENGTH) != 0) {
            sealing_failed = 1;  /* the reference decoder reports the mismatch */
            break;
        }
        const span identified[4] = {pubsub, content, meta, payload};
        uint8_t *muid = (uint8_t *)out[O_MUID] + muid_at;
        sha256_parts(muid, identified, 4);
        Py_ssize_t meta_part = meta.len < MUID_META_PART ? meta.len : MUID_META_PART;
        if (meta_part)
            memcpy(muid + SHA256_DIGEST_LENGTH, meta.ptr, (size_t)meta_part);
        const span digested[2] = {content, payload};
        sha256_parts((uint8_t *)out[O_DIGEST] + i * SHA256_DIGEST_LENGTH, digested, 2);
        if (meta.len)
            memcpy(out[O_META] + meta_at, meta.ptr, (size_t)meta.len);
        if (r->bytes[F_PROOF].len)
            memcpy(out[O_PROOF] + proof_at, r->bytes[F_PROOF].ptr, (size_t)r->bytes[F_PROOF].len);
        payload_at += (int32_t)r->payload_len;
        meta_at += (int32_t)meta.len;
        proof_at += (int32_t)r->bytes[F_PROOF].len;
        muid_at += (int32_t)(SHA256_DIGEST_LENGTH + meta_part);
        ((int32_t *)out[O_PAYLOAD_OFF])[i + 1] = payload_at;
        ((int32_t *)out[O_META_OFF])[i + 1] = meta_at;
        ((int32_t *)out[O_PROOF_OFF])[i + 1] = proof_at;
        ((int32_t *)out[O_MUID_OFF])[i + 1] = muid_at;
        ((int32_t *)out[O_PUBSUB_INDEX])[i] = r->pubsub;
        ((int32_t *)out[O_TOPIC_INDEX])[i] = r->topic;
        ((int32_t *)out[O_VERSION])[i] = (int32_t)r->ints[F_VERSION];
        ((int64_t *)out[O_SENDER])[i] = r->sender;
        ((int64_t *)out[O_ARRIVAL])[i] = r->arrival;
    }
    Py_END_ALLOW_THREADS
    if (sealing_failed) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *topic_list = PyList_New(topic_count), *pubsub_list = PyList_New(pubsub_count);
    objects[15] = PyTuple_Pack(2, topic_list ? topic_list : Py_None, pubsub_list ? pubsub_list : Py_None);
    Py_XDECREF(topic_list);
    Py_XDECREF(pubsub_list);
    if (!topic_list || !pubsub_list || !objects[15])
        goto done;
    for (int i = 0; i < topic_count; i++) {
        PyObject *v = PyBytes_FromStringAndSize((const char *)topics[i].value.ptr, topics[i].value.len);
        if (!v)
            goto done;
        PyList_SET_ITEM(topic_list, i, v);
    }
    for (int i = 0; i < pubsub_count; i++) {
        PyObject *v = PyBytes_FromStringAndSize((const char *)pubsubs[i].value.ptr, pubsubs[i].value.len);
        if (!v)
            goto done;
        PyList_SET_ITEM(pubsub_list, i, v);
    }
    PyObject *meta_object = PyBytes_FromStringAndSize((const char *)metadata, metadata_len);
    if (!meta_object)
        goto done;
    /* (count, metadata, topics, pubsub topics, then the 15 buffers in enum order) */
    result = Py_BuildValue("(nNOO" "OOOOOOOOOOOOOOO)", count, meta_object, topic_list, pubsub_list,
                           objects[0], objects[1], objects[2], objects[3], objects[4], objects[5], objects[6],
                           objects[7], objects[8], objects[9], objects[10], objects[11], objects[12],
                           objects[13], objects[14]);
done:
    for (int i = 0; i < 16; i++)
        Py_XDECREF(objects[i]);
    if (topics)
        for (int i = 0; i < topic_count; i++)
            if (topics[i].cipher)
                EVP_CIPHER_CTX_free(topics[i].cipher);
    PyMem_Free(topics);
    PyMem_Free(pubsubs);
    PyMem_Free(records);
    PyBuffer_Release(&body);
    return result;
}

/* storage.key_filter: probe j of a key whose first 16 bytes are the
 * little-endian words (h1, h2) is (h1 + j * (h2 | 1)) mod 2^64, masked to
 * the array's bit count (a power of two). */
static inline void key_words(const uint8_t *key, uint64_t *h1, uint64_t *h2)
{
    memcpy(h1, key, 8);
    memcpy(h2, key + 8, 8);
    *h2 |= 1;
}

static int bloom_args(PyObject *args, Py_buffer *bits, Py_buffer *words, unsigned *probes, int writable)
{
    if (!PyArg_ParseTuple(args, writable ? "w*y*I" : "y*y*I", bits, words, probes))
        return -1;
    Py_ssize_t size = bits->len;
    if (size < 8 || (size & (size - 1)) || words->len % 16 || *probes == 0 || *probes > 64) {
        PyBuffer_Release(bits);
        PyBuffer_Release(words);
        PyErr_SetString(PyExc_ValueError, "bits must be a power of two bytes (>= 8), words 16 bytes a key, "
                                          "probes 1 to 64");
        return -1;
    }
    return 0;
}

static PyObject *bloom_add(PyObject *self, PyObject *args)
{
    Py_buffer bits, words;
    unsigned probes;
    if (bloom_args(args, &bits, &words, &probes, 1))
        return NULL;
    uint8_t *array = bits.buf;
    const uint8_t *keys = words.buf;
    uint64_t mask = (uint64_t)bits.len * 8 - 1;
    Py_ssize_t count = words.len / 16;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t h1, h2;
        key_words(keys + 16 * i, &h1, &h2);
        for (unsigned j = 0; j < probes; j++) {
            uint64_t at = (h1 + (uint64_t)j * h2) & mask;
            array[at >> 3] |= (uint8_t)(1u << (at & 7));
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bits);
    PyBuffer_Release(&words);
    Py_RETURN_NONE;
}

static PyObject *bloom_test(PyObject *self, PyObject *args)
{
    Py_buffer bits, words;
    unsigned probes;
    if (bloom_args(args, &bits, &words, &probes, 0))
        return NULL;
    Py_ssize_t count = words.len / 16;
    PyObject *found = PyBytes_FromStringAndSize(NULL, count);
    if (found) {
        const uint8_t *array = bits.buf, *keys = words.buf;
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(found);
        uint64_t mask = (uint64_t)bits.len * 8 - 1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++) {
            uint64_t h1, h2;
            key_words(keys + 16 * i, &h1, &h2);
            uint8_t all = 1;
            for (unsigned j = 0; j < probes && all; j++) {
                uint64_t at = (h1 + (uint64_t)j * h2) & mask;
                all = (array[at >> 3] >> (at & 7)) & 1;
            }
            out[i] = all;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&bits);
    PyBuffer_Release(&words);
    return found;
}

static inline uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* The first position in run[lo, hi) (each width bytes) not below key, by
 * binary search. */
static Py_ssize_t bisect(const uint8_t *run, Py_ssize_t lo, Py_ssize_t hi, const uint8_t *key, size_t width)
{
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (memcmp(run + (size_t)mid * width, key, width) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first position in run[lo, n) not below key. The keys are hashes,
 * uniform: a guess from the first 8 bytes lands within ~sqrt(n) places of
 * it, then a gallop brackets it, so a search touches a page or two of a
 * mapped run instead of one per halving. */
static Py_ssize_t lower_bound(const uint8_t *run, Py_ssize_t lo, Py_ssize_t n, const uint8_t *key, size_t width)
{
    Py_ssize_t hi = n;
    if (hi - lo <= 64 || width < 8)
        return bisect(run, lo, hi, key, width);
    uint64_t a = be64(run + (size_t)lo * width), b = be64(run + (size_t)(hi - 1) * width), k = be64(key);
    if (k < a)
        return lo;
    if (k > b)
        return hi;
    if (b == a)
        return bisect(run, lo, hi, key, width);
    Py_ssize_t g = lo + (Py_ssize_t)((double)(k - a) / (double)(b - a) * (double)(hi - 1 - lo));
    if (g < lo)
        g = lo;
    if (g > hi - 1)
        g = hi - 1;
    Py_ssize_t step = 1;
    if (memcmp(run + (size_t)g * width, key, width) < 0) {
        Py_ssize_t from = g + 1; /* the bound lies at from or after */
        while (from + step <= hi && memcmp(run + (size_t)(from + step - 1) * width, key, width) < 0) {
            from += step;
            step <<= 1;
        }
        return bisect(run, from, from + step < hi ? from + step : hi, key, width);
    }
    Py_ssize_t to = g; /* run[to] is not below key */
    while (to - step >= lo && memcmp(run + (size_t)(to - step) * width, key, width) >= 0) {
        to -= step;
        step <<= 1;
    }
    return bisect(run, to - step + 1 > lo ? to - step + 1 : lo, to, key, width);
}

static PyObject *find_keys(PyObject *self, PyObject *args)
{
    PyObject *runs;
    Py_buffer keys;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "Oy*n", &runs, &keys, &width))
        return NULL;
    PyObject *sequence = PySequence_Fast(runs, "runs must be a sequence of buffers");
    if (sequence == NULL || width <= 0 || keys.len % width) {
        if (sequence != NULL)
            PyErr_SetString(PyExc_ValueError, "keys must be a whole number of width-byte keys");
        Py_XDECREF(sequence);
        PyBuffer_Release(&keys);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence), nkeys = keys.len / width;
    PyObject *out = PyList_New(0);
    Py_buffer run;
    /* Hits of one run, gathered without the GIL: (position, key) pairs. */
    Py_ssize_t capacity = 64, found;
    Py_ssize_t *hits = PyMem_RawMalloc(sizeof(Py_ssize_t) * 2 * capacity);
    if (hits == NULL) {
        Py_XDECREF(out);
        out = PyErr_NoMemory();
    }
    for (Py_ssize_t r = 0; out != NULL && r < count; r++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(sequence, r), &run, PyBUF_SIMPLE)) {
            Py_CLEAR(out);
            break;
        }
        Py_ssize_t n = run.len / width;
        const uint8_t *base = run.buf, *wanted = keys.buf;
        int full = 0;
        found = 0;
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t lo = 0;
        for (Py_ssize_t k = 0; k < nkeys && lo < n && !full; k++) {
            const uint8_t *key = wanted + (size_t)k * width;
            lo = lower_bound(base, lo, n, key, (size_t)width);
            /* Every copy of the key (a run may hold one twice). */
            for (Py_ssize_t at = lo; at < n && memcmp(base + (size_t)at * width, key, width) == 0; at++) {
                if (found == capacity) {
                    Py_ssize_t *more = PyMem_RawRealloc(hits, sizeof(Py_ssize_t) * 4 * capacity);
                    if (more == NULL) {
                        full = 1;
                        break;
                    }
                    hits = more;
                    capacity *= 2;
                }
                hits[2 * found] = at;
                hits[2 * found + 1] = k;
                found++;
            }
        }
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&run);
        if (full) {
            Py_CLEAR(out);
            PyErr_NoMemory();
            break;
        }
        for (Py_ssize_t i = 0; i < found; i++) {
            PyObject *hit = Py_BuildValue("(nnn)", r, hits[2 * i], hits[2 * i + 1]);
            if (hit == NULL || PyList_Append(out, hit)) {
                Py_XDECREF(hit);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(hit);
        }
    }
    PyMem_RawFree(hits);
    Py_DECREF(sequence);
    PyBuffer_Release(&keys);
    return out;
}


/* --- Parquet offset indexes (storage/parquet_pages.py) ------------------ */

/* Thrift compact protocol: an unsigned varint at *pos, within end. */
static int tc_varint(const uint8_t **pos, const uint8_t *end, uint64_t *out)
{
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= end)
            return -1;
        uint8_t byte = *(*pos)++;
        value |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return 0;
        }
    }
    return -1;
}

static int tc_skip(const uint8_t **pos, const uint8_t *end, int type, int depth);

/* Skip the fields of a struct through its STOP. */
static int tc_skip_struct(const uint8_t **pos, const uint8_t *end, int depth)
{
    if (depth > 32)
        return -1;
    for (;;) {
        if (*pos >= end)
            return -1;
        uint8_t header = *(*pos)++;
        if (header == 0)
            return 0;
        uint64_t ignored;
        if (!(header >> 4) && tc_varint(pos, end, &ignored))
            return -1;
        int type = header & 0x0F;
        if (type == 1 || type == 2) /* a field's boolean is in its header */
            continue;
        if (tc_skip(pos, end, type, depth + 1))
            return -1;
    }
}

static int tc_skip(const uint8_t **pos, const uint8_t *end, int type, int depth)
{
    uint64_t value;
    switch (type) {
    case 1: case 2: case 3: /* a list's boolean, a byte */
        if (*pos >= end)
            return -1;
        (*pos)++;
        return 0;
    case 4: case 5: case 6:
        return tc_varint(pos, end, &value);
    case 7:
        if (end - *pos < 8)
            return -1;
        *pos += 8;
        return 0;
    case 8:
        if (tc_varint(pos, end, &value) || (uint64_t)(end - *pos) < value)
            return -1;
        *pos += value;
        return 0;
    case 9: case 10: {
        if (*pos >= end || depth > 32)
            return -1;
        uint8_t header = *(*pos)++;
        uint64_t count = header >> 4;
        if (count == 15 && tc_varint(pos, end, &count))
            return -1;
        if (count > (uint64_t)(end - *pos))
            return -1;
        for (uint64_t i = 0; i < count; i++)
            if (tc_skip(pos, end, header & 0x0F, depth + 1))
                return -1;
        return 0;
    }
    case 12:
        return tc_skip_struct(pos, end, depth);
    default:
        return -1;
    }
}

/* The field header at *pos of a struct whose last field was *field: 1 at
 * its STOP, 0 with *field and *type set, -1 past end. */
static int tc_field(const uint8_t **pos, const uint8_t *end, int16_t *field, int *type)
{
    if (*pos >= end)
        return -1;
    uint8_t header = *(*pos)++;
    if (header == 0)
        return 1;
    if (header >> 4) {
        *field = (int16_t)(*field + (header >> 4));
    } else {
        uint64_t raw;
        if (tc_varint(pos, end, &raw))
            return -1;
        *field = (int16_t)((raw >> 1) ^ -(int64_t)(raw & 1));
    }
    *type = header & 0x0F;
    return 0;
}

/* One OffsetIndex at *pos: up to max_pages (offset, size, first row) into
 * out; the page count, or -1 for bytes that are not one. */
static long offset_index(const uint8_t **pos, const uint8_t *end, int64_t *out, long max_pages)
{
    long pages = -1;
    int16_t field = 0;
    int type;
    uint64_t raw;
    for (;;) {
        int at = tc_field(pos, end, &field, &type);
        if (at < 0)
            return -1;
        if (at > 0)
            return pages;
        if (field != 1 || type != 9) {
            if (type != 1 && type != 2 && tc_skip(pos, end, type, 1))
                return -1;
            continue;
        }
        if (*pos >= end)
            return -1;
        uint8_t list = *(*pos)++;
        uint64_t count = list >> 4;
        if (count == 15 && tc_varint(pos, end, &count))
            return -1;
        if ((list & 0x0F) != 12 || count > (uint64_t)max_pages)
            return -1;
        for (uint64_t i = 0; i < count; i++) {
            int64_t spot[3] = {-1, -1, -1};
            int16_t inner = 0;
            int t;
            for (;;) {
                int at = tc_field(pos, end, &inner, &t);
                if (at < 0)
                    return -1;
                if (at > 0)
                    break;
                if (inner >= 1 && inner <= 3 && (t == 5 || t == 6)) {
                    if (tc_varint(pos, end, &raw))
                        return -1;
                    spot[inner - 1] = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
                } else if (t != 1 && t != 2 && tc_skip(pos, end, t, 2)) {
                    return -1;
                }
            }
            if (spot[0] < 0 || spot[1] < 0 || spot[2] < 0)
                return -1;
            memcpy(out + 3 * i, spot, sizeof spot);
        }
        pages = (long)count;
    }
}

static PyObject *offset_indexes(PyObject *self, PyObject *args)
{
    Py_buffer region;
    Py_ssize_t count, max_pages;
    if (!PyArg_ParseTuple(args, "y*nn", &region, &count, &max_pages))
        return NULL;
    if (count < 0 || max_pages < 1 || count > PY_SSIZE_T_MAX / (3 * 8 * max_pages)) {
        PyBuffer_Release(&region);
        PyErr_SetString(PyExc_ValueError, "bad count or max_pages");
        return NULL;
    }
    PyObject *spots = PyBytes_FromStringAndSize(NULL, count * max_pages * 3 * 8);
    PyObject *pages = PyBytes_FromStringAndSize(NULL, count * 8);
    if (spots == NULL || pages == NULL) {
        Py_XDECREF(spots);
        Py_XDECREF(pages);
        PyBuffer_Release(&region);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(spots);
    int64_t *counts = (int64_t *)PyBytes_AS_STRING(pages);
    memset(out, 0xFF, (size_t)(count * max_pages * 3 * 8));
    const uint8_t *pos = region.buf, *end = pos + region.len;
    Py_ssize_t parsed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; parsed < count; parsed++) {
        long n = offset_index(&pos, end, out + parsed * max_pages * 3, (long)max_pages);
        if (n < 0)
            break;
        counts[parsed] = n;
    }
    Py_END_ALLOW_THREADS
    Py_ssize_t consumed = pos - (const uint8_t *)region.buf;
    PyBuffer_Release(&region);
    if (parsed < count) {
        Py_DECREF(spots);
        Py_DECREF(pages);
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(NNn)", spots, pages, consumed);
}


/* --- encode_entries: a Store page's rows, column by column, as protobuf --- */

/* A binary column as Arrow holds it: count + 1 int32 offsets into data. */
typedef struct {
    Py_buffer offsets, data;
    int held;
} column;

enum { FORM_V3_KEYS, FORM_V3_DATA, FORM_V2 };

static size_t varint_size(uint64_t value)
{
    size_t size = 1;
    while (value >= 0x80) {
        value >>= 7;
        size++;
    }
    return size;
}

static uint8_t *put_varint(uint8_t *out, uint64_t value)
{
    while (value >= 0x80) {
        *out++ = (uint8_t)(value | 0x80);
        value >>= 7;
    }
    *out++ = (uint8_t)value;
    return out;
}

static int column_get(PyObject *pair, column *c, Py_ssize_t count, const char *name)
{
    c->held = 0;
    if (pair == Py_None)
        return 0;
    if (!PyArg_ParseTuple(pair, "y*y*", &c->offsets, &c->data)) {
        PyErr_Format(PyExc_TypeError, "column %s must be (offsets, data)", name);
        return -1;
    }
    c->held = 1;
    if (c->offsets.len != (count + 1) * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_Format(PyExc_ValueError, "column %s: %zd offset bytes for %zd rows", name, c->offsets.len, count);
        return -1;
    }
    const int32_t *at = c->offsets.buf;
    for (Py_ssize_t i = 0; i < count; i++)
        if (at[i] < 0 || at[i + 1] < at[i] || at[i + 1] > c->data.len) {
            PyErr_Format(PyExc_ValueError, "column %s: offsets out of order or past the data", name);
            return -1;
        }
    return 0;
}

static void column_release(column *c)
{
    if (c->held) {
        PyBuffer_Release(&c->offsets);
        PyBuffer_Release(&c->data);
        c->held = 0;
    }
}

static inline span column_at(const column *c, Py_ssize_t i)
{
    const int32_t *at = c->offsets.buf;
    span s = {(const uint8_t *)c->data.buf + at[i], at[i + 1] - at[i]};
    return s;
}

/* Size of a length-delimited field of `size` bytes with a tag of tag_size bytes. */
static inline size_t field_size(size_t tag_size, size_t size)
{
    return tag_size + varint_size(size) + size;
}

/* The WakuMessage of row i, every field written (protos/waku_message.proto):
 * payload 1, content_topic 2, version 3, timestamp 10 (zigzag), meta 11,
 * rate_limit_proof 21, ephemeral 31 (false). */
static size_t message_size(column *cols, const int32_t *version, const int64_t *sender, Py_ssize_t i)
{
    int64_t ts = sender[i];
    uint64_t zigzag = ((uint64_t)ts << 1) ^ (uint64_t)(ts >> 63);
    return field_size(1, column_at(&cols[0], i).len) + field_size(1, column_at(&cols[1], i).len) + 1 +
           varint_size((uint32_t)version[i]) + 1 + varint_size(zigzag) + field_size(1, column_at(&cols[2], i).len) +
           field_size(2, column_at(&cols[3], i).len) + 3;
}

static uint8_t *put_bytes(uint8_t *out, const uint8_t *tag, size_t tag_size, span value)
{
    memcpy(out, tag, tag_size);
    out = put_varint(out + tag_size, (uint64_t)value.len);
    memcpy(out, value.ptr, value.len);
    return out + value.len;
}

static uint8_t *put_message(uint8_t *out, column *cols, const int32_t *version, const int64_t *sender, Py_ssize_t i)
{
    static const uint8_t payload[] = {0x0a}, content[] = {0x12}, meta[] = {0x5a}, proof[] = {0xaa, 0x01};
    int64_t ts = sender[i];
    out = put_bytes(out, payload, 1, column_at(&cols[0], i));
    out = put_bytes(out, content, 1, column_at(&cols[1], i));
    *out++ = 0x18;
    out = put_varint(out, (uint32_t)version[i]);
    *out++ = 0x50;
    out = put_varint(out, ((uint64_t)ts << 1) ^ (uint64_t)(ts >> 63));
    out = put_bytes(out, meta, 1, column_at(&cols[2], i));
    out = put_bytes(out, proof, 2, column_at(&cols[3], i));
    *out++ = 0xf8;
    *out++ = 0x01;
    *out++ = 0x00;
    return out;
}

static PyObject *encode_entries(PyObject *self, PyObject *args)
{
    int form;
    Py_ssize_t count;
    PyObject *pairs[6];
    Py_buffer version = {0}, sender = {0}, order;
    PyObject *version_obj, *sender_obj;
    static const char *names[6] = {"message_hash", "pubsub_topic", "payload", "content_topic", "meta", "rate_limit_proof"};
    if (!PyArg_ParseTuple(args, "iny*OOOOOOOO", &form, &count, &order, &pairs[0], &pairs[1], &pairs[2], &pairs[3],
                          &pairs[4], &pairs[5], &version_obj, &sender_obj))
        return NULL;
    if (form < FORM_V3_KEYS || form > FORM_V2 || count < 0 || order.len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "unknown form, negative count or order not int64");
        PyBuffer_Release(&order);
        return NULL;
    }
    /* The rows written, in this order: positions among the columns' count rows. */
    const int64_t *rows = order.buf;
    Py_ssize_t written = order.len / (Py_ssize_t)sizeof(int64_t);
    column cols[6];
    PyObject *out = NULL;
    int data = form != FORM_V3_KEYS, ok = 1;
    for (int c = 0; c < 6; c++)
        cols[c].held = 0;
    for (int c = 0; c < 6 && ok; c++) {
        /* The hash for v3, the pubsub topic for v3 with data, the message's columns with data. */
        int needed = c == 0 ? form != FORM_V2 : c == 1 ? form == FORM_V3_DATA : data;
        if (needed && pairs[c] == Py_None) {
            PyErr_Format(PyExc_ValueError, "column %s is needed", names[c]);
            ok = 0;
        } else if (needed && column_get(pairs[c], &cols[c], count, names[c]))
            ok = 0;
    }
    for (Py_ssize_t k = 0; k < written && ok; k++)
        if (rows[k] < 0 || rows[k] >= count) {
            PyErr_SetString(PyExc_ValueError, "order names a row past the columns");
            ok = 0;
        }
    if (ok && data) {
        if (PyObject_GetBuffer(version_obj, &version, PyBUF_SIMPLE) ||
            PyObject_GetBuffer(sender_obj, &sender, PyBUF_SIMPLE))
            ok = 0;
        else if (version.len != count * (Py_ssize_t)sizeof(int32_t) ||
                 sender.len != count * (Py_ssize_t)sizeof(int64_t)) {
            PyErr_SetString(PyExc_ValueError, "version and sender_timestamp must hold one value a row");
            ok = 0;
        } else {
            const int32_t *v = version.buf;
            for (Py_ssize_t i = 0; i < count && ok; i++)
                if (v[i] < 0) {
                    PyErr_SetString(PyExc_ValueError, "version does not fit uint32");
                    ok = 0;
                }
        }
    }
    if (ok) {
        column *message = &cols[2];
        const int32_t *v = version.buf;
        const int64_t *ts = sender.buf;
        size_t total = 0;
        for (Py_ssize_t k = 0; k < written; k++) {
            Py_ssize_t i = (Py_ssize_t)rows[k];
            if (form == FORM_V2) {
                total += field_size(1, message_size(message, v, ts, i));
                continue;
            }
            size_t entry = field_size(1, column_at(&cols[0], i).len);
            if (form == FORM_V3_DATA)
                entry += field_size(1, message_size(message, v, ts, i)) + field_size(1, column_at(&cols[1], i).len);
            total += field_size(2, entry);
        }
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
        if (out != NULL) {
            uint8_t *at = (uint8_t *)PyBytes_AS_STRING(out);
            static const uint8_t entry_tag[] = {0xa2, 0x01}, hash_tag[] = {0x0a}, pubsub_tag[] = {0x1a};
            for (Py_ssize_t k = 0; k < written; k++) {
                Py_ssize_t i = (Py_ssize_t)rows[k];
                if (form == FORM_V2) {
                    *at++ = 0x12;
                    at = put_varint(at, message_size(message, v, ts, i));
                    at = put_message(at, message, v, ts, i);
                    continue;
                }
                size_t entry = field_size(1, column_at(&cols[0], i).len), size = 0;
                if (form == FORM_V3_DATA) {
                    size = message_size(message, v, ts, i);
                    entry += field_size(1, size) + field_size(1, column_at(&cols[1], i).len);
                }
                memcpy(at, entry_tag, 2);
                at = put_varint(at + 2, entry);
                at = put_bytes(at, hash_tag, 1, column_at(&cols[0], i));
                if (form == FORM_V3_DATA) {
                    *at++ = 0x12;
                    at = put_varint(at, size);
                    at = put_message(at, message, v, ts, i);
                    at = put_bytes(at, pubsub_tag, 1, column_at(&cols[1], i));
                }
            }
        }
    }
    for (int c = 0; c < 6; c++)
        column_release(&cols[c]);
    if (version.obj != NULL)
        PyBuffer_Release(&version);
    if (sender.obj != NULL)
        PyBuffer_Release(&sender);
    PyBuffer_Release(&order);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_status_go", decode_status_go, METH_VARARGS,
     "decode_status_go(body, topic_keys, default_pubsub) -> tuple | None\n\n"
     "A status-go archive body's records as table columns (see the module source), or None\n"
     "when the body is not in the plain form this decoder reads."},
    {"bloom_add", bloom_add, METH_VARARGS, "bloom_add(bits, words, probes): set each key's probe bits."},
    {"bloom_test", bloom_test, METH_VARARGS,
     "bloom_test(bits, words, probes) -> bytes: 1 where every probe bit of the key is set."},
    {"find_keys", find_keys, METH_VARARGS,
     "find_keys(runs, keys, width) -> [(run, position, key)]: where each of the sorted keys\n"
     "stands in each buffer of sorted width-byte keys."},
    {"offset_indexes", offset_indexes, METH_VARARGS,
     "offset_indexes(region, count, max_pages) -> (spots, pages, consumed) | None: count Parquet\n"
     "OffsetIndex structs back to back from the region's start, each page's (offset, size, first row)\n"
     "as int64 [count][max_pages][3] (-1 past its pages) and each one's page count; None when one\n"
     "is not an OffsetIndex of at most max_pages pages."},
    {"encode_entries", encode_entries, METH_VARARGS,
     "encode_entries(form, count, order, message_hash, pubsub_topic, payload, content_topic, meta,\n"
     "rate_limit_proof, version, sender_timestamp) -> bytes: the rows at the int64 positions of order\n"
     "among count rows held in Arrow-style columns, as protobuf fields (form 0: v3 entries without\n"
     "data, 1: v3 entries with data, 2: legacy v2 messages)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wakustore._native",
                                    "The per-message loops of a hydrating member, in C.", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
