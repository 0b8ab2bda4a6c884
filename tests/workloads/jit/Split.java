// Splits its CPU between two Java methods, hotA 3 ms for every 1 ms of
// hotB, and measures the time each really spent (its oracle), written to
// STATS every 200 ms as "hotA NS hotB NS".
//
// java -XX:+PreserveFramePointer -XX:CompileCommand=dontinline,Split::* Split.java SECONDS STATS
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

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
        sink = spin(start + 3_000_000L);
        spentA += System.nanoTime() - start;
    }

    static void hotB() {
        long start = System.nanoTime();
        sink = spin(start + 1_000_000L);
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
