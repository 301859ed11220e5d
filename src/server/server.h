/* server — `tandem serve`: an OpenAI-compatible HTTP server (libmicrohttpd)
 * whose single scheduler thread feeds every request into a speculative group
 * as a row (continuous batching). Entry point for the CLI; see srv.h for the
 * internal structure. Uses only include/tandem.h (and the CLI's shared option
 * parsing, src/cli/cli.h, which the tandem binary links). */
#ifndef TD_SERVER_H
#define TD_SERVER_H

/* Run `tandem serve` with argv[0] = "serve". Returns the process exit status:
 * 0 after a graceful shutdown (SIGINT/SIGTERM), 1 on a startup failure, 2 on
 * bad options. */
int td_serve_main(int argc, char **argv);

#endif
