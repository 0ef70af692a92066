/* abi_check.c: the polyfuse C ABI from strict C99 (gcc -std=c99 -pedantic).
 *
 * Checks that the header compiles as C, and that from C the error codes,
 * messages, handle checks and frees behave as documented. Run under
 * valgrind by scripts/abi-test.sh, so every string and handle handed out is
 * freed here.
 *
 * usage: abi_check PROGRAM.json     (examples/gemm.json)
 * exit status: 0 all checks passed, 1 a check failed. */

#include <polyfuse.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                    \
        }                                                                  \
    } while (0)

/* Whether `s` (freed here) contains `needle`. */
static int message_has(char *s, const char *needle) {
    int found = s != NULL && strstr(s, needle) != NULL;
    if (!found) fprintf(stderr, "message `%s` lacks `%s`\n", s ? s : "(null)", needle);
    pf_string_free(s);
    return found;
}

/* A pf_log_fn counting the warnings it receives in the int at `user`. */
static void count_warnings(void *user, int32_t level, const char *message) {
    if (level == PF_LOG_WARNING && message != NULL && message[0] != '\0') (*(int *)user)++;
}

int main(int argc, char **argv) {
    pf_context *ctx = NULL;
    pf_result *res = NULL;
    char *s = NULL;
    size_t n = 0, i;
    int64_t tile[2] = {16, 0};

    if (argc < 2) {
        fprintf(stderr, "usage: abi_check PROGRAM.json\n");
        return 1;
    }
    CHECK(pf_abi_version() == PF_ABI_VERSION);
    CHECK(strlen(pf_version()) > 0);

    /* Null and forged handles. */
    CHECK(pf_context_destroy(NULL) == PF_ERR_INVALID_HANDLE);
    CHECK(message_has(pf_last_error_message(), "null"));
    CHECK(pf_result_num_kernels(NULL, &n) == PF_ERR_INVALID_HANDLE);
    CHECK(pf_context_set_sink((pf_context *)&n, 1) == PF_ERR_INVALID_HANDLE);
    CHECK(pf_context_set_schedule_timeout(NULL, 5) == PF_ERR_INVALID_HANDLE);
    CHECK(pf_context_set_arch(NULL, "sm_90") == PF_ERR_INVALID_HANDLE);
    CHECK(pf_context_set_device(NULL, 0) == PF_ERR_INVALID_HANDLE);
    CHECK(pf_result_workspace_size(NULL, NULL, 0, &n) == PF_ERR_INVALID_HANDLE);
    CHECK(pf_context_create(NULL) == PF_ERR_INVALID_ARGUMENT);

    CHECK(pf_context_create(&ctx) == PF_OK);
    /* Bad JSON and bad options. */
    CHECK(pf_context_load_json(ctx, "{\"name\": ") == PF_ERR_INPUT);
    CHECK(message_has(pf_context_error_message(ctx), "not valid JSON"));
    /* Text with its length: a NUL inside is refused, not cut at. */
    {
        static const char with_nul[] = "{\"name\": \"t\"}\0garbage";
        CHECK(pf_context_load_json_n(ctx, with_nul, sizeof with_nul - 1) == PF_ERR_INPUT);
        CHECK(message_has(pf_context_error_message(ctx), "NUL byte at offset 13"));
        CHECK(pf_context_load_json_n(ctx, NULL, 4) == PF_ERR_INVALID_ARGUMENT);
    }
    CHECK(pf_context_set_strategy(ctx, "fastest") == PF_ERR_INPUT);
    CHECK(message_has(pf_context_error_message(ctx), "unknown strategy"));
    CHECK(pf_context_set_tile(ctx, tile, 2) == PF_ERR_INPUT);
    CHECK(pf_context_set_param(ctx, "K") == PF_ERR_INPUT);
    CHECK(pf_context_set_arch(ctx, "compute_90") == PF_ERR_INPUT);
    CHECK(message_has(pf_context_error_message(ctx), "is not a GPU architecture"));
    CHECK(pf_context_set_arch(ctx, "sm_90a") == PF_OK);
    CHECK(pf_context_set_arch(ctx, NULL) == PF_OK);
    CHECK(pf_context_set_device(ctx, -2) == PF_ERR_INPUT);
    CHECK(message_has(pf_context_error_message(ctx), "ordinal"));
    CHECK(pf_context_set_device(ctx, -1) == PF_OK);
    CHECK(pf_compile(ctx, &res) == PF_ERR_INPUT);
    CHECK(res == NULL);

    /* A good compile for the cpu target. */
    CHECK(pf_context_load_file(ctx, argv[1]) == PF_OK);
    CHECK(pf_context_set_param_value(ctx, "M", 0) == PF_ERR_INPUT);
    CHECK(pf_context_set_param_value(ctx, "M", 37) == PF_OK);
    CHECK(pf_context_set_tile(ctx, tile, 1) == PF_OK);
    CHECK(pf_context_set_schedule_timeout(ctx, 120) == PF_OK); /* watched compile */
    CHECK(pf_compile(ctx, &res) == PF_OK);
    CHECK(pf_context_error_message(ctx) == NULL);
    CHECK(pf_result_num_kernels(res, &n) == PF_OK && n == 0);
    CHECK(pf_result_c_source(res, &s) == PF_OK);
    CHECK(strstr(s, "pf_kernel") != NULL);
    CHECK(pf_string_free(s) == PF_OK);
    CHECK(pf_string_free(s) == PF_ERR_INVALID_HANDLE); /* double free */
    CHECK(pf_result_schedule_tree(res, &s) == PF_OK);
    CHECK(message_has(s, "domain"));
    CHECK(pf_result_cuda_source(res, &s) == PF_ERR_INVALID_ARGUMENT);
    CHECK(message_has(pf_result_error_message(res), "cpu target"));
    CHECK(pf_result_num_args(res, &n) == PF_OK);
    for (i = 0; i < n; i++) {
        pf_arg_kind kind = -1;
        int64_t extent = 0;
        CHECK(pf_result_arg_kind(res, i, &kind) == PF_OK && kind == PF_ARG_TENSOR);
        CHECK(pf_result_arg_name(res, i, &s) == PF_OK);
        pf_string_free(s);
        CHECK(pf_result_arg_extent(res, i, 0, NULL, 0, &extent) == PF_OK && extent > 0);
        CHECK(pf_result_arg_dim(res, i, 0, &s) == PF_OK && strlen(s) > 0);
        pf_string_free(s);
    }
    /* Every parameter has a value (M from the context): none symbolic. */
    CHECK(pf_result_num_params(res, &n) == PF_OK && n == 0);
    CHECK(pf_result_param_name(res, 0, &s) == PF_ERR_INVALID_ARGUMENT);
    CHECK(pf_result_target(res, &s) == PF_OK && strcmp(s, "cpu") == 0);
    pf_string_free(s);

    /* Every tensor in one call agrees with the one-field calls: the struct's
     * layout is the library's. */
    {
        pf_tensor_info infos[8];
        size_t count = 0, k;
        CHECK(pf_result_tensors(res, NULL, 0, NULL, 0, &count) == PF_OK && count == 3);
        CHECK(pf_result_tensors(res, NULL, 0, infos, 8, &count) == PF_OK && count == 3);
        for (k = 0; k < count && k < 8; k++) {
            pf_role role = -1;
            pf_dtype dtype = -1;
            size_t bytes = 0, rank = 0;
            int64_t extent = 0;
            CHECK(pf_result_arg_role(res, infos[k].arg_index, &role) == PF_OK && role == infos[k].role);
            CHECK(pf_result_arg_dtype(res, infos[k].arg_index, &dtype) == PF_OK && dtype == infos[k].dtype);
            CHECK(pf_result_arg_rank(res, infos[k].arg_index, &rank) == PF_OK && rank == infos[k].rank);
            CHECK(pf_result_arg_bytes(res, infos[k].arg_index, NULL, 0, &bytes) == PF_OK && bytes == infos[k].bytes);
            CHECK(pf_result_arg_extent(res, infos[k].arg_index, 0, NULL, 0, &extent) == PF_OK &&
                  extent == infos[k].extents[0]);
            CHECK(pf_result_arg_name(res, infos[k].arg_index, &s) == PF_OK && strcmp(s, infos[k].name) == 0);
            pf_string_free(s);
        }
        CHECK(infos[0].role == PF_ROLE_INPUT && infos[2].role == PF_ROLE_OUTPUT);
        CHECK(infos[2].extents[0] == 37); /* M=37 */
    }

    /* The result outlives its context; handles die once. */
    CHECK(pf_context_destroy(ctx) == PF_OK);
    CHECK(pf_context_destroy(ctx) == PF_ERR_INVALID_HANDLE);
    CHECK(pf_result_num_args(res, &n) == PF_OK);
    CHECK(pf_result_destroy(res) == PF_OK);
    CHECK(pf_result_destroy(res) == PF_ERR_INVALID_HANDLE);

    /* The workspace of a program with temps (cpu target: its C function
     * touches every temp): each temp at an aligned offset, the size
     * covering them all; inputs and outputs have no offset. */
    {
        static const char softmax[] =
            "{\"name\": \"softmax\", \"params\": {\"N\": 5, \"D\": 7},"
            " \"inputs\": {\"X\": {\"dtype\": \"f32\", \"shape\": [\"N\", \"D\"]}},"
            " \"outputs\": {\"Y\": {\"dtype\": \"f32\", \"shape\": [\"N\", \"D\"]}},"
            " \"temps\": {\"M\": {\"dtype\": \"f32\", \"shape\": [\"N\"]},"
            " \"E\": {\"dtype\": \"f32\", \"shape\": [\"N\", \"D\"]}},"
            " \"body\": [\"M(r) max=! X(r, c)\", \"E(r, c) = exp(X(r, c) - M(r))\","
            " \"Y(r, c) = E(r, c) / M(r)\"]}";
        pf_tensor_info infos[4];
        size_t count = 0, bytes = 0, k;
        int64_t offset = 0, end = 0;
        CHECK(pf_context_create(&ctx) == PF_OK);
        CHECK(pf_context_load_json(ctx, softmax) == PF_OK);
        CHECK(pf_compile(ctx, &res) == PF_OK);
        CHECK(pf_result_workspace_size(res, NULL, 0, &bytes) == PF_OK);
        CHECK(pf_result_workspace_size(res, NULL, 0, NULL) == PF_ERR_INVALID_ARGUMENT);
        CHECK(pf_result_tensors(res, NULL, 0, infos, 4, &count) == PF_OK && count == 4);
        for (k = 0; k < count && k < 4; k++) {
            pf_status st = pf_result_arg_workspace_offset(res, infos[k].arg_index, NULL, 0, &offset);
            if (infos[k].role == PF_ROLE_TEMP) {
                CHECK(st == PF_OK && offset >= end && offset % PF_WORKSPACE_ALIGN == 0);
                end = offset + (int64_t)infos[k].bytes;
            } else {
                CHECK(st == PF_ERR_INVALID_ARGUMENT);
                CHECK(message_has(pf_result_error_message(res), "not a temp"));
            }
        }
        /* Two temps, the second at an aligned offset past the first. */
        CHECK((int64_t)bytes == end && end >= PF_WORKSPACE_ALIGN + 5 * 4);
        /* Ahead of time: the result saved and loaded back describes the
         * same workspace; a cpu result has no CUDA to make PTX of; what is
         * no artifact is refused. */
        {
            char *doc = NULL;
            pf_result *back = NULL;
            size_t again = 0;
            int32_t origin = -1;
            CHECK(pf_result_save(res, "sm_90", &doc) == PF_ERR_INVALID_ARGUMENT);
            CHECK(pf_result_save(res, NULL, &doc) == PF_OK && doc != NULL);
            CHECK(pf_result_load(doc, strlen(doc), &back) == PF_OK);
            CHECK(pf_result_workspace_size(back, NULL, 0, &again) == PF_OK && again == bytes);
            CHECK(pf_result_from_cache(back, &origin) == PF_OK && origin == 3);
            CHECK(pf_result_destroy(back) == PF_OK);
            CHECK(pf_string_free(doc) == PF_OK);
            CHECK(pf_result_load("{}", 2, &back) == PF_ERR_INPUT);
            CHECK(message_has(pf_last_error_message(), "polyfuse_artifact"));
            CHECK(pf_result_load("{}", 2, NULL) == PF_ERR_INVALID_ARGUMENT);
        }
        CHECK(pf_result_destroy(res) == PF_OK);
        CHECK(pf_context_destroy(ctx) == PF_OK);
    }

    /* The cuda target: kernels and launch configuration (no launch here). */
    CHECK(pf_context_create(&ctx) == PF_OK);
    CHECK(pf_context_load_file(ctx, argv[1]) == PF_OK);
    CHECK(pf_context_set_target(ctx, "cuda") == PF_OK);
    if (pf_compile(ctx, &res) == PF_OK) {
        uint32_t grid[3], block[3];
        size_t bytes = 1;
        void *io[3];
        /* gemm has no temps: an empty workspace; a caller's workspace must
         * be aligned, and the inputs and outputs non-null. Without a GPU
         * (or with pointers no driver knows) the launch fails cleanly. */
        CHECK(pf_result_workspace_size(res, NULL, 0, &bytes) == PF_OK && bytes == 0);
        io[0] = (void *)(uintptr_t)0x10000; io[1] = (void *)(uintptr_t)0x20000;
        io[2] = (void *)(uintptr_t)0x30000;
        CHECK(pf_result_launch_workspace(res, 0, NULL, io, (void *)(uintptr_t)0x40010, 64, NULL) ==
              PF_ERR_INVALID_ARGUMENT);
        CHECK(message_has(pf_result_error_message(res), "aligned"));
        {
            pf_status st = pf_result_launch_workspace(res, 0, NULL, io, NULL, 0, NULL);
            CHECK(st == PF_ERR_ENVIRONMENT || st == PF_ERR_INVALID_ARGUMENT);
        }
        io[0] = NULL;
        CHECK(pf_result_launch_workspace(res, 0, NULL, io, NULL, 0, NULL) == PF_ERR_INVALID_ARGUMENT);
        CHECK(message_has(pf_result_error_message(res), "is null"));
        CHECK(pf_result_num_kernels(res, &n) == PF_OK && n >= 1);
        CHECK(pf_result_kernel_grid(res, 0, NULL, 0, grid) == PF_OK && grid[0] >= 1);
        CHECK(pf_result_kernel_block(res, 0, block) == PF_OK && block[0] >= 1);
        CHECK(pf_result_kernel_name(res, 0, &s) == PF_OK);
        pf_string_free(s);
        CHECK(pf_result_cuda_source(res, &s) == PF_OK);
        CHECK(message_has(s, "__global__"));
        pf_string_free(s);
        {
            size_t dynamic_bytes = 1, static_bytes = 1;
            int32_t dependent = -1;
            CHECK(pf_result_kernel_shared_memory(res, 0, &dynamic_bytes, &static_bytes) == PF_OK);
            CHECK(pf_result_kernel_dependent(res, 0, &dependent) == PF_OK &&
                  (dependent == 0 || dependent == 1));
            CHECK(pf_result_kernel_dependent(res, n, &dependent) == PF_ERR_INVALID_ARGUMENT);
        }
        CHECK(pf_result_target(res, &s) == PF_OK && strcmp(s, "cuda") == 0);
        pf_string_free(s);
        /* One execution of the whole program: null pointers for tensors the
         * kernels touch are refused before any driver call. */
        io[0] = NULL;
        CHECK(pf_result_launch_all(res, NULL, io, NULL) == PF_ERR_INVALID_ARGUMENT);
        CHECK(pf_result_destroy(res) == PF_OK);
    } else {
        CHECK(message_has(pf_context_error_message(ctx), "CUDA"));
    }
    CHECK(pf_context_destroy(ctx) == PF_OK);

    /* The mapping's options: sizes checked, directives parsed. */
    {
        const uint32_t block[3] = {32, 8, 1}, zero[3] = {0, 1, 1}, grid[1] = {64};
        CHECK(pf_context_create(&ctx) == PF_OK);
        CHECK(pf_context_load_file(ctx, argv[1]) == PF_OK);
        CHECK(pf_context_set_block(ctx, block, 3) == PF_OK);
        CHECK(pf_context_set_block(ctx, zero, 3) == PF_ERR_INPUT);
        CHECK(pf_context_set_grid(ctx, grid, 1) == PF_OK);
        CHECK(pf_context_set_shared(ctx, 0) == PF_OK);
        CHECK(pf_context_set_directives(ctx, "[") == PF_ERR_INPUT);
        CHECK(pf_context_set_directives(ctx, NULL) == PF_OK);
        CHECK(pf_compile(ctx, &res) == PF_OK);
        CHECK(pf_result_destroy(res) == PF_OK);
        CHECK(pf_context_destroy(ctx) == PF_OK);
    }

    /* Notices go to the log callback: a cache file that is no cache (the
     * program itself) is a warning there, and the compilation goes on. */
    {
        int warnings = 0;
        CHECK(pf_context_set_log(NULL, count_warnings, &warnings) == PF_ERR_INVALID_HANDLE);
        CHECK(pf_context_create(&ctx) == PF_OK);
        CHECK(pf_context_load_file(ctx, argv[1]) == PF_OK);
        CHECK(pf_context_set_cache(ctx, argv[1]) == PF_OK);
        CHECK(pf_context_set_log(ctx, count_warnings, &warnings) == PF_OK);
        CHECK(pf_compile(ctx, &res) == PF_OK);
        CHECK(warnings == 1);
        CHECK(pf_result_destroy(res) == PF_OK);
        CHECK(pf_context_set_log(ctx, NULL, NULL) == PF_OK);
        CHECK(pf_compile(ctx, &res) == PF_OK);
        CHECK(warnings == 1);
        CHECK(pf_result_destroy(res) == PF_OK);
        CHECK(pf_context_destroy(ctx) == PF_OK);
    }

    if (failures == 0) printf("abi_check: ok\n");
    return failures == 0 ? 0 : 1;
}
