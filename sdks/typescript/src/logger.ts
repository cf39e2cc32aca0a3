// Where the worker says what it does. Any object with these four methods works (console,
// pino, winston); the default writes warnings and errors to stderr and the rest to stdout.

export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

export type LogLevel = "debug" | "info" | "warn" | "error" | "silent";

const ORDER: LogLevel[] = ["debug", "info", "warn", "error", "silent"];

/** A logger that prefixes each line with the time and drops levels below `level`. */
export function consoleLogger(level: LogLevel = "info"): Logger {
  const threshold = ORDER.indexOf(level);
  const line =
    (name: Exclude<LogLevel, "silent">, write: (text: string) => void) =>
    (message: string): void => {
      if (ORDER.indexOf(name) >= threshold) write(`${new Date().toISOString()} ${name} evora.worker: ${message}`);
    };
  return {
    debug: line("debug", console.log),
    info: line("info", console.log),
    warn: line("warn", console.error),
    error: line("error", console.error),
  };
}
