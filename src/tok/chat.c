/* chat — fixed renderers for the two chat templates tandem knows, instead of a
 * Jinja interpreter:
 *   ChatML (Qwen):  <|im_start|>{role}\n{content}<|im_end|>\n  per message,
 *                   generation prompt <|im_start|>assistant\n
 *   Llama 3:        <|begin_of_text|> then
 *                   <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
 *                   per message, generation prompt
 *                   <|start_header_id|>assistant<|end_header_id|>\n\n
 * Llama 3's template trims each content (Jinja `| trim`), and so does this.
 * These match the models' own templates for plain system/user/assistant turns
 * (no tools; Qwen3's template also adds an empty <think></think> block only to an
 * assistant turn that follows the last user turn, which this renderer does not).
 * Output goes through a bounded appender that keeps counting past cap, so the
 * caller can size a buffer with a first call. No allocation.
 */
#include <string.h>

#include "tandem.h"

static int td_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

typedef struct td_out { char *buf; size_t cap, n; } td_out;

static void td_out_putn(td_out *o, const char *s, size_t k) {
    if (o->n < o->cap) memcpy(o->buf + o->n, s, o->n + k <= o->cap ? k : o->cap - o->n);
    o->n += k;
}
static void td_out_put(td_out *o, const char *s) { td_out_putn(o, s, strlen(s)); }

int td_chat_render(td_chat_style style, const td_chat_msg *msgs, int n_msgs,
                   int add_generation_prompt, char *out, size_t cap) {
    if (n_msgs < 0 || (n_msgs > 0 && !msgs) || (!out && cap > 0)) return TD_EINVAL;
    if (style != TD_CHAT_CHATML && style != TD_CHAT_LLAMA3) return TD_EUNSUPPORTED;
    for (int i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content) return TD_EINVAL;
    td_out o = { out, cap, 0 };
    if (style == TD_CHAT_CHATML) {
        for (int i = 0; i < n_msgs; i++) {
            td_out_put(&o, "<|im_start|>");
            td_out_put(&o, msgs[i].role);
            td_out_put(&o, "\n");
            td_out_put(&o, msgs[i].content);
            td_out_put(&o, "<|im_end|>\n");
        }
        if (add_generation_prompt) td_out_put(&o, "<|im_start|>assistant\n");
    } else {
        td_out_put(&o, "<|begin_of_text|>");
        for (int i = 0; i < n_msgs; i++) {
            td_out_put(&o, "<|start_header_id|>");
            td_out_put(&o, msgs[i].role);
            td_out_put(&o, "<|end_header_id|>\n\n");
            const char *c = msgs[i].content;
            size_t k = strlen(c);
            while (k > 0 && td_is_ws(*c)) { c++; k--; }
            while (k > 0 && td_is_ws(c[k - 1])) k--;
            td_out_putn(&o, c, k);
            td_out_put(&o, "<|eot_id|>");
        }
        if (add_generation_prompt) td_out_put(&o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    if (o.n > (size_t)2147483647) return TD_ERANGE;
    if (o.n < cap) out[o.n] = 0;
    return (int)o.n;
}
