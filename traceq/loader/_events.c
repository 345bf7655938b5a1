/* One pass from a batch of compacted trace events (one JSON object a line) to Arrow
 * columns, handed to Polars through the Arrow PyCapsule interface.
 *
 * Why: the pure-Python decode reads each event four times (msgspec compacts and cuts,
 * Polars parses every key and all of `args` into a DOM it throws away, msgspec reads the
 * times and the `args` text). This reads the compacted lines once, keeps `args` as its
 * exact text, and releases the GIL while it does.
 *
 * It never decides anything the Python path would decide differently: the lines were
 * compacted by msgspec, so they are valid JSON without whitespace, and whatever is not the
 * plain shape of a Kineto event (an escape or a non-ASCII byte, a number with an exponent
 * or past 18 digits, a value of another JSON type than the key's usual one, a key twice,
 * one of the format's rare keys, deep nesting) makes `parse` return None, and the caller
 * reads that batch the Python way. Columns, in order: ph cat name pid tid ts dur id bp s
 * args; ts and dur are float64, the rest text (pid, tid and id keep an integer's digits).
 *
 * Traces are untrusted input: every size is computed in int64 with its bound checked
 * first (`add_size`, `mul_size`), and a text that Arrow's string view cannot describe (a
 * length or a data offset past int32) hands the batch back too, as does a count of events
 * the bytes cannot hold. `scan` is split.py's tokenizer: where the top-level commas of
 * `traceEvents` are, carried from piece to piece, so cutting stays linear.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The Arrow C data interface (arrow.apache.org/docs/format/CDataInterface.html). */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#define ARROW_FLAG_NULLABLE 2

enum { PH, CAT, NAME, PID, TID, TS, DUR, ID, BP, S, ARGS, NCOLS };
static const char *COLUMN_NAMES[NCOLS] = {"ph", "cat", "name", "pid", "tid", "ts",
                                          "dur", "id", "bp", "s", "args"};
#define IS_FLOAT(c) ((c) == TS || (c) == DUR)
#define MAX_DEPTH 64
#define MAX_DIGITS 18
/* Arrow's string view holds a length and a data offset as int32 (the format's spec). */
#define VIEW_MAX INT32_MAX

typedef struct {
    uint8_t *valid;   /* validity bitmap, one bit a row */
    int64_t *offsets; /* text: n + 1 offsets into data, while parsing */
    uint8_t *views;   /* text: Arrow's 16-byte views, made from the offsets */
    char *data;       /* text bytes */
    int64_t size, cap;
    double *values; /* ts, dur */
    int64_t nulls;
} Column;

typedef struct {
    Column col[NCOLS];
    int64_t n;
    int float_times;   /* a time written with a fraction */
    int64_t view_max;  /* the longest text, and the furthest offset of one, a view holds */
} Batch;

/* a + b and a * b for sizes (a, b >= 0): 0, or -1 where the result would pass `limit`. */
static int add_size(int64_t a, int64_t b, int64_t limit, int64_t *out) {
    if (a < 0 || b < 0 || a > limit - b) return -1;
    *out = a + b;
    return 0;
}

static int mul_size(int64_t a, int64_t b, int64_t limit, int64_t *out) {
    if (a < 0 || b < 0 || (b && a > limit / b)) return -1;
    *out = a * b;
    return 0;
}

/* What one malloc may be asked for: size_t's range and int64's, whichever is smaller. */
#define ALLOC_MAX ((int64_t)(SIZE_MAX < (uint64_t)INT64_MAX ? SIZE_MAX : INT64_MAX))

/* Arrays exported and not yet released (`live()`, for the tests). Polars may release an
 * array from one of its own threads, without the GIL: the count is atomic where it can be. */
static int64_t live_arrays;
#if defined(__GNUC__) || defined(__clang__)
#define COUNT_LIVE(delta) __atomic_add_fetch(&live_arrays, (delta), __ATOMIC_RELAXED)
#else
#define COUNT_LIVE(delta) (live_arrays += (delta))
#endif

static void batch_free(Batch *b) {
    for (int c = 0; c < NCOLS; c++) {
        free(b->col[c].valid);
        free(b->col[c].offsets);
        free(b->col[c].views);
        free(b->col[c].data);
        free(b->col[c].values);
    }
    free(b);
}

/* The columns of `n` rows from `bytes` of lines; NULL without memory (or where a size
 * would overflow: the caller has bounded n by the bytes, so it cannot). */
static Batch *batch_new(int64_t n, int64_t bytes, int64_t view_max) {
    int64_t rows, names, small;
    if (add_size(n, 1, ALLOC_MAX / 8, &rows) || mul_size(n, 4, ALLOC_MAX, &small) ||
        add_size(small, 64, ALLOC_MAX, &small) || bytes < 0)
        return NULL;
    names = bytes / 4 + 64;
    Batch *b = calloc(1, sizeof(Batch));
    if (!b) return NULL;
    b->n = n;
    b->view_max = view_max;
    for (int c = 0; c < NCOLS; c++) {
        Column *col = &b->col[c];
        col->valid = calloc((size_t)(n / 8 + 1), 1);
        if (IS_FLOAT(c)) {
            col->values = calloc((size_t)rows, sizeof(double));
            if (!col->valid || !col->values) goto fail;
        } else {
            col->offsets = calloc((size_t)rows, sizeof(int64_t));
            col->cap = c == ARGS ? bytes / 2 + 64 : (c == NAME ? names : small);
            col->data = malloc((size_t)col->cap);
            if (!col->valid || !col->offsets || !col->data) goto fail;
        }
    }
    return b;
fail:
    batch_free(b);
    return NULL;
}

/* A text into row `row`: 0; -1 where a view cannot hold it (its length, or past 12 bytes
 * its offset, beyond `view_max`: the batch goes back to Python); -2 without memory. */
static int append(Column *col, int64_t row, const char *text, int64_t len, int64_t view_max) {
    int64_t need, cap;
    if (len < 0 || len > view_max || (len > 12 && col->size > view_max)) return -1;
    if (add_size(col->size, len, ALLOC_MAX, &need)) return -2;
    if (need > col->cap) {
        cap = need <= ALLOC_MAX / 2 ? need * 2 : need;
        char *data = realloc(col->data, (size_t)cap);
        if (!data) return -2;
        col->data = data;
        col->cap = cap;
    }
    memcpy(col->data + col->size, text, (size_t)len);
    col->size += len;
    col->valid[row >> 3] |= (uint8_t)(1u << (row & 7));
    return 0;
}

/* After each row: the text column's next offset (a null adds none of its bytes). */
static void close_row(Batch *b, int64_t row) {
    for (int c = 0; c < NCOLS; c++) {
        Column *col = &b->col[c];
        int present = (col->valid[row >> 3] >> (row & 7)) & 1;
        if (!present) col->nulls++;
        if (!IS_FLOAT(c)) col->offsets[row + 1] = col->size;
    }
}

/* Bytes that end a run of plain string content: a quote, a backslash, non-ASCII. And
 * those that matter to `scan`: outside a string, a quote, the brackets and commas; inside
 * one, its quote and a backslash. */
static unsigned char STOPS[256], TOKENS[256], IN_STRING[256];

static void init_stops(void) {
    STOPS['"'] = STOPS['\\'] = 1;
    for (int ch = 0x80; ch < 256; ch++) STOPS[ch] = 1;
    for (const char *t = "\"{}[],"; *t; t++) TOKENS[(unsigned char)*t] = 1;
    IN_STRING['"'] = IN_STRING['\\'] = 1;
}

static const char *to_stop(const char *p, const char *end) {
    while (p < end && !STOPS[(unsigned char)*p]) p++; /* strings are short: no word tricks */
    return p;
}

/* A string at p (p at its opening quote), plain: no escape, ASCII only. Returns the byte
 * after its closing quote, or NULL. */
static const char *plain_string(const char *p, const char *end, const char **start) {
    *start = ++p;
    p = to_stop(p, end);
    return p < end && *p == '"' ? p + 1 : NULL;
}

/* A number at p: its end, and how many digits its fraction has (-1: none); NULL for an
 * exponent or too many digits (the Python path then decides what it is). */
static const char *plain_number(const char *p, const char *end, int *fraction) {
    int digits = 0;
    *fraction = -1;
    if (p < end && *p == '-') p++;
    while (p < end) {
        char ch = *p;
        if (ch >= '0' && ch <= '9') {
            if (*fraction >= 0) ++*fraction;
            else if (++digits > MAX_DIGITS) return NULL; /* past int64: Polars decides */
        } else if (ch == '.') {
            if (*fraction >= 0) return NULL;
            *fraction = 0;
        } else if (ch == 'e' || ch == 'E' || ch == '+') {
            return NULL;
        } else {
            break;
        }
        p++;
    }
    return digits && *fraction != 0 ? p : NULL; /* "1." is not JSON */
}

/* The double nearest a plain number's decimal value (at most 18 digits and 3 decimals),
 * as strtod gives it, by integer arithmetic where that is exact: an integer converts
 * correctly rounded, and a fraction's digits, while they fit in 2**53, are divided by a
 * power of ten, one correctly rounded operation. strtod past that. */
static double to_double(const char *start, const char *end, int fraction) {
    static const double TENS[] = {1.0, 10.0, 100.0, 1000.0};
    const char *p = start + (*start == '-');
    uint64_t digits = 0;
    int count = 0;
    for (; p < end; p++)
        if (*p != '.') digits = digits * 10 + (uint64_t)(*p - '0'), count++;
    if (fraction < 0 ? count <= 18 : count <= 19 && digits <= (1ull << 53)) { /* exact */
        double value = (double)digits / TENS[fraction > 0 ? fraction : 0];
        return *start == '-' ? -value : value;
    }
    char text[32]; /* a plain number here: a sign, 18 digits, a point and 3 decimals */
    memcpy(text, start, (size_t)(end - start));
    text[end - start] = 0;
    return strtod(text, NULL);
}

/* Any value at p: the byte after it, or NULL where this pass leaves the batch to Python. */
static const char *skip_value(const char *p, const char *end) {
    int depth = 0;
    while (p < end) {
        char ch = *p;
        if (ch == '"') {
            /* an escape's backslash and the byte after it (a backslash last: no end) */
            for (p = to_stop(p + 1, end); p < end && *p == '\\'; p = to_stop(p + 2, end))
                if (end - p < 2) return NULL;
            if (p >= end || *p != '"') return NULL; /* non-ASCII, or no end */
            p++;
        } else if (ch == '{' || ch == '[') {
            if (++depth > MAX_DEPTH) return NULL;
            p++;
        } else if (ch == '}' || ch == ']') {
            if (depth == 0) return p;
            depth--;
            p++;
        } else if (ch == ',' || ch == ':') {
            if (depth == 0) return p;
            p++;
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            int fraction;
            p = plain_number(p, end, &fraction);
            if (!p) return NULL;
        } else if (ch == 't' || ch == 'f' || ch == 'n') {
            while (p < end && *p >= 'a' && *p <= 'z') p++;
        } else {
            return NULL;
        }
        if (depth == 0) return p;
    }
    return depth == 0 ? p : NULL;
}

static int column_of(const char *key, Py_ssize_t len) {
    switch (len) {
    case 1:
        return key[0] == 's' ? S : -1;
    case 2:
        if (!memcmp(key, "ph", 2)) return PH;
        if (!memcmp(key, "ts", 2)) return TS;
        if (!memcmp(key, "id", 2)) return ID;
        if (!memcmp(key, "bp", 2)) return BP;
        if (!memcmp(key, "sf", 2)) return -2;
        return -1;
    case 3:
        if (!memcmp(key, "cat", 3)) return CAT;
        if (!memcmp(key, "pid", 3)) return PID;
        if (!memcmp(key, "tid", 3)) return TID;
        if (!memcmp(key, "dur", 3)) return DUR;
        if (!memcmp(key, "tts", 3) || !memcmp(key, "id2", 3)) return -2;
        return -1;
    case 4:
        if (!memcmp(key, "name", 4)) return NAME;
        if (!memcmp(key, "args", 4)) return ARGS;
        if (!memcmp(key, "tdur", 4)) return -2;
        return -1;
    case 5:
        if (!memcmp(key, "scope", 5) || !memcmp(key, "cname", 5) || !memcmp(key, "stack", 5))
            return -2;
        return -1;
    case 7:
        return memcmp(key, "bind_id", 7) ? -1 : -2;
    default:
        return -1;
    }
}

/* One event's line into row `row`; 0, or -1 to leave the batch to Python (-2: no memory). */
static int parse_event(Batch *b, int64_t row, const char *p, const char *end) {
    unsigned seen = 0;
    if (p >= end || *p != '{') return -1;
    p++;
    if (p < end && *p == '}') {
        p++;
        goto done;
    }
    for (;;) {
        const char *key;
        if (p >= end || *p != '"') return -1;
        p = plain_string(p, end, &key);
        if (!p || p >= end || *p != ':') return -1;
        int c = column_of(key, (Py_ssize_t)(p - 1 - key));
        p++;
        if (c == -2) return -1; /* a rare key: Polars' full schema */
        if (c >= 0) {
            if (seen & (1u << c)) return -1;
            seen |= 1u << c;
        }
        if (p >= end) return -1;
        if (c == -1) {
            p = skip_value(p, end);
            if (!p) return -1;
        } else if (*p == 'n') { /* null: the row stays null */
            if (end - p < 4 || memcmp(p, "null", 4)) return -1;
            p += 4;
        } else if (c == ARGS) {
            const char *start = p;
            p = skip_value(p, end);
            if (!p) return -1;
            int status = append(&b->col[ARGS], row, start, p - start, b->view_max);
            if (status) return status;
        } else if (IS_FLOAT(c)) {
            int fraction;
            const char *start = p;
            p = plain_number(p, end, &fraction);
            /* past a nanosecond's digits, float parsers may round a tie apart */
            if (!p || fraction > 3) return -1;
            b->col[c].values[row] = to_double(start, p, fraction);
            b->col[c].valid[row >> 3] |= (uint8_t)(1u << (row & 7));
            b->float_times |= fraction >= 0;
        } else if (*p == '"') {
            const char *start;
            p = plain_string(p, end, &start);
            if (!p) return -1;
            int status = append(&b->col[c], row, start, p - 1 - start, b->view_max);
            if (status) return status;
        } else if (c == PID || c == TID || c == ID) { /* an integer: its digits, as Polars */
            int fraction;
            const char *start = p;
            p = plain_number(p, end, &fraction);
            if (!p || fraction >= 0 || (p - start == 2 && start[0] == '-' && start[1] == '0'))
                return -1;
            int status = append(&b->col[c], row, start, p - start, b->view_max);
            if (status) return status;
        } else {
            return -1; /* another type where text belongs: the Python path explains it */
        }
        if (p >= end) return -1;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '}') {
            p++;
            break;
        }
        return -1;
    }
done:
    if (p != end) return -1;
    close_row(b, row);
    return 0;
}

/* Arrow export: each column its own array, owning its own buffers, so a column Polars
 * keeps (it imports without copying) holds no other column's memory. Text goes out as
 * Arrow's string views ("vu"), Polars' own layout: 16 bytes a row, a string of up to 12
 * bytes inline, a longer one by offset into one data buffer cut to its size. */
typedef struct {
    void *owned[4]; /* validity, values or views, data, variadic buffer sizes */
    const void *buffers[4];
} Owned;

static void release_array(struct ArrowArray *array) {
    Owned *own = array->private_data;
    for (int i = 0; i < 4; i++) free(own->owned[i]);
    free(own);
    COUNT_LIVE(-1);
    array->release = NULL;
}

static void release_schema(struct ArrowSchema *schema) { schema->release = NULL; }

static void capsule_schema_free(PyObject *capsule) {
    struct ArrowSchema *schema = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (schema && schema->release) schema->release(schema);
    free(schema);
}

static void capsule_array_free(PyObject *capsule) {
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "arrow_array");
    if (array && array->release) array->release(array);
    free(array);
}

/* The text column's offsets made views (GIL released); the offsets are freed. 0; -1
 * where a length or an offset does not fit a view (`append` refused those already: this
 * is the last line of defence), -2 without memory. */
static int to_views(Column *col, int64_t n, int64_t view_max) {
    int64_t bytes;
    if (mul_size(n > 0 ? n : 1, 16, ALLOC_MAX, &bytes)) return -2;
    for (int64_t row = 0; row < n; row++) {
        int64_t start = col->offsets[row], len = col->offsets[row + 1] - start;
        if (start < 0 || len < 0 || start > col->size - len || len > view_max ||
            (len > 12 && start > view_max))
            return -1;
    }
    uint8_t *views = calloc((size_t)bytes / 16, 16);
    if (!views) return -2;
    for (int64_t row = 0; row < n; row++) {
        int64_t start = col->offsets[row];
        int32_t len = (int32_t)(col->offsets[row + 1] - start); /* checked above */
        uint8_t *view = views + 16 * row;
        memcpy(view, &len, 4);
        if (len <= 12) {
            memcpy(view + 4, col->data + start, (size_t)len);
        } else {
            int32_t buffer = 0, offset = (int32_t)start;
            memcpy(view + 4, col->data + start, 4);
            memcpy(view + 8, &buffer, 4);
            memcpy(view + 12, &offset, 4);
        }
    }
    free(col->offsets);
    col->offsets = NULL;
    col->views = views;
    char *data = realloc(col->data, (size_t)(col->size > 0 ? col->size : 1));
    if (data) col->data = data;
    return 0;
}

/* (schema, array) capsules of one column; its buffers move out of `col`. */
static PyObject *export_column(Column *col, int c, int64_t n) {
    struct ArrowSchema *schema = calloc(1, sizeof(*schema));
    struct ArrowArray *array = calloc(1, sizeof(*array));
    Owned *own = calloc(1, sizeof(*own));
    int64_t *sizes = IS_FLOAT(c) ? NULL : malloc(sizeof(int64_t));
    if (!schema || !array || !own || (!IS_FLOAT(c) && !sizes)) {
        free(schema);
        free(array);
        free(own);
        free(sizes);
        return PyErr_NoMemory();
    }
    own->owned[0] = col->valid;
    own->buffers[0] = col->nulls ? col->valid : NULL;
    if (IS_FLOAT(c)) {
        own->owned[1] = col->values;
        own->buffers[1] = col->values;
    } else {
        *sizes = col->size;
        own->owned[1] = col->views;
        own->owned[2] = col->data;
        own->owned[3] = sizes;
        own->buffers[1] = col->views;
        own->buffers[2] = col->data;
        own->buffers[3] = sizes;
    }
    col->valid = NULL;
    col->values = NULL;
    col->views = NULL;
    col->data = NULL;
    *schema = (struct ArrowSchema){
        .format = IS_FLOAT(c) ? "g" : "vu",
        .name = COLUMN_NAMES[c],
        .flags = ARROW_FLAG_NULLABLE,
        .release = release_schema,
    };
    *array = (struct ArrowArray){
        .length = n,
        .null_count = col->nulls,
        .n_buffers = IS_FLOAT(c) ? 2 : 4,
        .buffers = own->buffers,
        .release = release_array,
        .private_data = own,
    };
    COUNT_LIVE(1);
    PyObject *s = PyCapsule_New(schema, "arrow_schema", capsule_schema_free);
    PyObject *a = PyCapsule_New(array, "arrow_array", capsule_array_free);
    if (!s || !a) {
        if (s)
            Py_DECREF(s);
        else
            free(schema); /* no capsule owns it */
        if (!a) {
            array->release(array);
            free(array);
        }
        Py_XDECREF(a);
        return NULL;
    }
    return Py_BuildValue("(NN)", s, a);
}

static PyObject *export(Batch *b) {
    PyObject *columns = PyTuple_New(NCOLS);
    if (!columns) {
        batch_free(b);
        return NULL;
    }
    for (int c = 0; c < NCOLS; c++) {
        PyObject *pair = export_column(&b->col[c], c, b->n);
        if (!pair) {
            Py_DECREF(columns);
            batch_free(b);
            return NULL;
        }
        PyTuple_SET_ITEM(columns, c, pair);
    }
    PyObject *result = Py_BuildValue("(NO)", columns, b->float_times ? Py_True : Py_False);
    batch_free(b); /* its buffers have moved to the arrays */
    return result;
}

/* parse(lines: bytes, n: int, view_max: int = 2**31 - 1) -> (((schema, array) capsules a
 * column, ...), float_times) or None. `view_max` only lowers the bound on a text's length
 * and offset (a test reaches it without 2 GiB of text); above int32 it is int32. */
static PyObject *parse(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t n, view_max = VIEW_MAX;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n|n", &view, &n, &view_max)) return NULL;
    if (n < 0 || view_max < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, n < 0 ? "n < 0" : "view_max < 0");
        return NULL;
    }
    if (view_max > VIEW_MAX) view_max = VIEW_MAX;
    /* n events take at least 3n - 1 bytes ("{}" and a newline each): more cannot match */
    if (n > view.len / 3 + 1) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    Batch *b = batch_new(n, view.len, view_max);
    if (!b) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    const char *p = view.buf, *end = p + view.len;
    int64_t row = 0;
    while (row < n && status == 0) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = eol ? eol : end;
        status = parse_event(b, row, p, line_end);
        row++;
        p = eol ? eol + 1 : end;
        if (!eol && row < n) status = -1; /* fewer lines than events */
    }
    if (status == 0 && p < end) status = -1; /* more lines than events */
    for (int c = 0; c < NCOLS && status == 0; c++)
        if (!IS_FLOAT(c)) status = to_views(&b->col[c], n, b->view_max);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status != 0) {
        batch_free(b);
        if (status == -2) return PyErr_NoMemory();
        Py_RETURN_NONE;
    }
    return export(b);
}

/* scan(buf, start, state) -> (comma, state): split.py's tokenizer. `buf` from its start
 * is the inside of `traceEvents`, just after its `[` or a top-level comma; `state` is
 * where the scan of buf[:start] left off (0 at the start). Returns the offset of the
 * last comma between two events in buf[start:] (-1: none) and the state at the end of
 * `buf`: depth << 2 | in a string << 1 | after a backslash, or -1 once the array has
 * closed. It reads, it does not check: split.py's probe (msgspec) proves each cut. */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, comma = -1;
    long long state;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nL", &view, &start, &state)) return NULL;
    if (start < 0 || start > view.len || state < -1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start outside the buffer, or not a scan's state");
        return NULL;
    }
    if (state == -1) {
        PyBuffer_Release(&view);
        return Py_BuildValue("(nL)", (Py_ssize_t)-1, state);
    }
    int64_t depth = (int64_t)(state >> 2);
    int in_string = (int)(state >> 1 & 1), escape = (int)(state & 1), closed = 0;
    const unsigned char *buf = view.buf, *p = buf + start, *end = buf + view.len;
    Py_BEGIN_ALLOW_THREADS
    while (p < end) {
        if (in_string) {
            if (escape) {
                escape = 0;
                p++;
                continue;
            }
            while (p < end && !IN_STRING[*p]) p++;
            if (p == end) break;
            if (*p == '\\') escape = 1;
            else in_string = 0;
            p++;
            continue;
        }
        while (p < end && !TOKENS[*p]) p++;
        if (p == end) break;
        switch (*p) {
        case '"':
            in_string = 1;
            break;
        case '{':
        case '[':
            depth++; /* at most one a byte: int64 holds it */
            break;
        case '}':
        case ']':
            closed = depth == 0;
            depth--;
            break;
        default: /* ',' */
            if (depth == 0) comma = p - buf;
        }
        if (closed) break;
        p++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    state = closed ? -1 : (long long)depth << 2 | in_string << 1 | escape;
    return Py_BuildValue("(nL)", comma, state);
}

static PyObject *live(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(COUNT_LIVE(0));
}

static PyMethodDef METHODS[] = {
    {"live", live, METH_NOARGS, "live() -> column arrays exported and not yet released"},
    {"parse", parse, METH_VARARGS,
     "parse(lines, n, view_max=2**31-1) -> (columns, float_times) or None: n compacted "
     "events, one a line, each column a pair of Arrow capsules; None leaves the batch to the "
     "Python path (also where a text's length or offset passes view_max, at most int32)."},
    {"scan", scan, METH_VARARGS,
     "scan(buf, start, state) -> (comma, state): the last top-level comma of traceEvents in "
     "buf[start:] (-1: none) and the tokenizer's state at the end (-1: the array closed)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "_events", .m_size = -1, .m_methods = METHODS,
};

PyMODINIT_FUNC PyInit__events(void) {
    init_stops();
    return PyModule_Create(&MODULE);
}
