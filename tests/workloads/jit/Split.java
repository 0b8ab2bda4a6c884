// Splits its CPU between two Java methods, hotA 3 ms for every 1 ms of
// hotB on average, and measures the time each really spent (its oracle),
// written to STATS every 200 ms as "hotA NS hotB NS". Each turn's length is
// drawn at random (hotA 2-4 ms, hotB 0.5-1.5 ms): a fixed 4-ms rhythm would
// beat with the sampler's 10.1-ms period.
//
// java -XX:+PreserveFramePointer -XX:CompileCommand=dontinline,Split::* Split.java SECONDS STATS
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.concurrent.ThreadLocalRandom;

public class Split {
    static long spentA;
    static long spentB;
    static int sink;

    static int spin(long untilNs) {
        int x = sink;
        while (System.nanoTime() < untilNs) {
            for (int i = 0; i < 2000; i++) {
                x = x * 31 + i;
            }
        }
        return x;
    }

    static void hotA() {
        long start = System.nanoTime();
        sink = spin(start + ThreadLocalRandom.current().nextLong(2_000_000L, 4_000_000L));
        spentA += System.nanoTime() - start;
    }

    static void hotB() {
        long start = System.nanoTime();
        sink = spin(start + ThreadLocalRandom.current().nextLong(500_000L, 1_500_000L));
        spentB += System.nanoTime() - start;
    }

    public static void main(String[] args) throws Exception {
        long end = System.nanoTime() + Long.parseLong(args[0]) * 1_000_000_000L;
        Path stats = Path.of(args[1]);
        Path partial = Path.of(args[1] + ".tmp");
        long lastWrite = 0;
        while (System.nanoTime() < end) {
            hotA();
            hotB();
            if (System.nanoTime() - lastWrite >= 200_000_000L) {
                Files.writeString(partial, "hotA " + spentA + " hotB " + spentB);
                Files.move(partial, stats, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
                lastWrite = System.nanoTime();
            }
        }
    }
}
