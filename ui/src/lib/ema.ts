// De-biased exponential moving average, as TensorBoard smooths scalars: an EMA started at 0 is
// divided by (1 - weight^n) so the first points are not pulled towards zero.

/**
 * Smooths `values` with weight `weight` in [0, 1) (0: no smoothing). Non-finite values pass
 * through unchanged and do not enter the average; a constant series is returned as is (the
 * division would otherwise add rounding noise to a flat line).
 */
export function debiasedEma(values: ArrayLike<number | null>, weight: number): (number | null)[] {
  const out: (number | null)[] = new Array(values.length);
  const first = values.length > 0 ? values[0] : null;
  let constant = true;
  for (let i = 0; i < values.length; i++) {
    if (values[i] !== first) {
      constant = false;
      break;
    }
  }
  let last = 0;
  let count = 0;
  for (let i = 0; i < values.length; i++) {
    const value = values[i];
    if (value === null || constant || !Number.isFinite(value)) {
      out[i] = value;
      continue;
    }
    last = last * weight + (1 - weight) * value;
    count++;
    const debias = weight === 1 ? 1 : 1 - Math.pow(weight, count);
    out[i] = last / debias;
  }
  return out;
}
