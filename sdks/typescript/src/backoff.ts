// Exponential backoff with jitter, and an abortable sleep.

export interface BackoffOptions {
  /** The ceiling of the first delay, in milliseconds. */
  initialMs?: number;
  /** The largest ceiling, in milliseconds. */
  maxMs?: number;
  multiplier?: number;
}

/**
 * Retry n waits between half and all of `min(maxMs, initialMs * multiplier ** (n - 1))`.
 * Half the ceiling is guaranteed so that delays really grow while a server is down; the
 * random other half spreads out many clients that failed at the same moment.
 */
export class RetryBackoff {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly multiplier: number;

  constructor(options: BackoffOptions = {}) {
    this.initialMs = options.initialMs ?? 200;
    this.maxMs = options.maxMs ?? 5_000;
    this.multiplier = options.multiplier ?? 2;
    if (!(this.initialMs > 0 && this.initialMs <= this.maxMs) || !(this.multiplier >= 1)) {
      throw new RangeError("need 0 < initialMs <= maxMs and multiplier >= 1");
    }
  }

  /** The largest delay before retry number `retry` (1 for the first retry). */
  ceiling(retry: number): number {
    // Workers retry claims forever: the power grows to Infinity, which min() caps.
    return Math.min(this.maxMs, this.initialMs * this.multiplier ** Math.max(retry - 1, 0));
  }

  delay(retry: number, random: () => number = Math.random): number {
    const ceiling = this.ceiling(retry);
    return ceiling / 2 + (random() * ceiling) / 2;
  }
}

/** Resolves after `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
