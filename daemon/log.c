/* SPDX-License-Identifier: MIT */
/*
 * log.c - stderr logging, one write(2) per line so that lines from the loop
 * thread and from backend threads never interleave mid-line.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = RND_LOG_INFO;
static bool log_journal;

static const char *const level_names[] = {
    [RND_LOG_ERROR] = "error", [RND_LOG_WARNING] = "warning", [RND_LOG_NOTICE] = "notice",
    [RND_LOG_INFO] = "info",   [RND_LOG_DEBUG] = "debug",
};

int rnd_log_level_parse(const char *s)
{
    for (int l = RND_LOG_ERROR; l <= RND_LOG_DEBUG; l++)
        if (strcmp(s, level_names[l]) == 0)
            return l;
    if (strcmp(s, "warn") == 0)
        return RND_LOG_WARNING;
    return -1;
}

const char *rnd_log_level_name(int level)
{
    if (level < RND_LOG_ERROR || level > RND_LOG_DEBUG)
        return "?";
    return level_names[level];
}

/*
 * systemd sets JOURNAL_STREAM=dev:ino for the stream it connected to our
 * stderr.  A child whose stderr was redirected elsewhere inherits the
 * variable, so compare it with what stderr really is.
 */
void rnd_log_init(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;

    log_journal = false;
    if (js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
        (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino)
        log_journal = true;
}

void rnd_log_set_level(int level) { atomic_store(&log_level, level); }
int rnd_log_get_level(void) { return atomic_load(&log_level); }

void rnd_log(int level, const char *fmt, ...)
{
    char line[1024];
    size_t len;
    va_list ap;
    int n;

    if (level > atomic_load(&log_level))
        return;
    if (log_journal) {
        n = snprintf(line, sizeof line, "<%d>", level);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-7s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
    }
    len = n > 0 ? (size_t)n : 0;
    va_start(ap, fmt);
    n = vsnprintf(line + len, sizeof line - len - 1, fmt, ap);
    va_end(ap);
    if (n > 0)
        len += (size_t)n < sizeof line - len - 1 ? (size_t)n : sizeof line - len - 2;
    /* A message must stay one line even if it quotes client-supplied text. */
    for (size_t i = 0; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
