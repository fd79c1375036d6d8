"""How closely two differently compiled programs agree: the one place tests state it.

Bit-equality holds only where both sides run the same compiled program on the same machine (a
resumed run against an uninterrupted one, the same jitted function twice). Two programs that
compute the same mathematics (the static and the continuous sampler, one device and a mesh,
micro-batched and whole-batch updates) may order their float32 reductions differently, and which
kernel XLA:CPU picks depends on the CPU model, its instruction set and the shapes.

Reordering a sum of n float32 terms moves it by at most about n * 2**-24 * sum|x_i| (Higham,
"Accuracy and Stability of Numerical Algorithms", 2nd ed., section 4.2). The test models have
widths of at most 64 and two layers, so each reduction has at most ~100 terms of magnitude O(1):
a few 1e-6 per reduction, ~1e-5 through the forward pass. Log-probs, logits, losses and other O(1)
results are therefore compared at ACROSS_PROGRAMS. Tokens are compared exactly: with the same
sampling key a token can change only where two candidates lie within that rounding of each other,
which random weights make vanishingly unlikely (and a test that hits such a tie fails loudly).
"""
ACROSS_PROGRAMS = dict(rtol=2e-5, atol=2e-5)

# bfloat16 keeps 8 significant bits, so every operation's output is rounded by up to 2**-9 of
# itself. Where two programs order a float32 sum differently, the sum can land on either side of a
# bfloat16 rounding boundary: their activations then differ by 2**-8 relative in scattered
# elements, and that difference is carried through every later layer. The test models' logits are
# at most ~10 in magnitude, computed through ~10 roundings in sequence over two layers: their
# log-probs agree to a few hundredths (measured: at most 0.05), compared at BF16_LOGPROBS.
BF16_LOGPROBS = dict(rtol=0, atol=0.1)
