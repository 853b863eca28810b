/* SPDX-License-Identifier: MIT */
/*
 * log.h - one line per event on stderr.  Under systemd (JOURNAL_STREAM names
 * our stderr) each line starts with a "<N>" syslog priority that journald
 * understands; elsewhere with a readable UTC timestamp and the level's name.
 */
#ifndef RND_LOG_H
#define RND_LOG_H

/* syslog priorities, so the journal prefix is the level itself. */
enum rnd_log_level {
    RND_LOG_ERROR = 3,
    RND_LOG_WARNING = 4,
    RND_LOG_NOTICE = 5,
    RND_LOG_INFO = 6,
    RND_LOG_DEBUG = 7,
};

/* Parse "debug" ... "error"; returns the level or -1. */
int rnd_log_level_parse(const char *s);
const char *rnd_log_level_name(int level);

/* Decide the line format from the environment (JOURNAL_STREAM) once at start. */
void rnd_log_init(void);
void rnd_log_set_level(int level);
int rnd_log_get_level(void);

/* Write one line (a trailing newline is added) if level is enabled. */
void rnd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define rnd_err(...) rnd_log(RND_LOG_ERROR, __VA_ARGS__)
#define rnd_warn(...) rnd_log(RND_LOG_WARNING, __VA_ARGS__)
#define rnd_notice(...) rnd_log(RND_LOG_NOTICE, __VA_ARGS__)
#define rnd_info(...) rnd_log(RND_LOG_INFO, __VA_ARGS__)
#define rnd_debug(...) rnd_log(RND_LOG_DEBUG, __VA_ARGS__)

#endif
