// What a user types for a quantity, read as kiln_formats::units reads it for the CLI
// (`kiln quota set --cpu 0.5 --mem 64G`), so a form and a command take the same text.

const SIZE_HINT = 'use a number with K, M, G or T, such as 512M or 4G';

/** Cores (`2`, `0.5`) as millicores. */
export function parseCpu(text: string): number {
  const trimmed = text.trim();
  // Rust's f64 syntax, not Number's (which also reads 0x10 and 0b1, which the CLI refuses).
  const cores = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(trimmed) ? Number(trimmed) : NaN;
  if (!Number.isFinite(cores)) throw new Error(`"${text}" is not a number of cores, such as 2 or 0.5`);
  if (cores < 0 || cores > 4_000_000) throw new Error(`"${text}" is not a number of cores`);
  return Math.round(cores * 1000);
}

/** A size (`512M`, `4G`, `1.5GiB`, `100`: bytes; powers of 1024) as bytes. */
export function parseSize(text: string): number {
  const found = /^(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:IB|I|B)?$/i.exec(text.trim());
  if (!found) throw new Error(`"${text}" is not a size: ${SIZE_HINT}`);
  const shift = { '': 0, K: 10, M: 20, G: 30, T: 40 }[found[2].toUpperCase() as '' | 'K' | 'M' | 'G' | 'T'];
  return Math.round(Number(found[1]) * 2 ** shift);
}

/** A count (`4`): a whole number, at least 0. */
export function parseCount(text: string, what: string): number {
  const trimmed = text.trim();
  if (!/^\d+$/.test(trimmed)) throw new Error(`${what} must be a whole number, such as 4`);
  return Number(trimmed);
}

/** Bytes as the shortest text `parseSize` reads back exactly (`4G`, `1536M`, `100`). */
export function sizeText(n: number): string {
  for (const [unit, shift] of [['T', 40], ['G', 30], ['M', 20], ['K', 10]] as const) {
    if (n > 0 && n % 2 ** shift === 0) return `${n / 2 ** shift}${unit}`;
  }
  return String(n);
}
