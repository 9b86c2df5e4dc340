// ESLint for the extension's TypeScript: the recommended and type-aware rule sets of
// typescript-eslint (types from tsconfig.json for the sources, tsconfig.test.json for the
// tests), with formatting left to Prettier.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'labextension/lib/**',
      'labextension/build-test/**',
      'pathways_kernel/labextension/**',
      'node_modules/**',
      '.venv/**'
    ]
  },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: {
        project: ['./tsconfig.json', './tsconfig.test.json'],
        tsconfigRootDir: import.meta.dirname
      }
    }
  },
  {
    files: ['labextension/**/*.ts'],
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      eqeqeq: ['error', 'smart'],
      curly: ['error', 'all']
    }
  },
  {
    // node:test runs each test() itself; the promise it returns is the runner's, not ours.
    files: ['labextension/test/**/*.ts'],
    rules: {
      '@typescript-eslint/no-floating-promises': [
        'error',
        { allowForKnownSafeCalls: [{ from: 'package', name: 'test', package: 'node:test' }] }
      ]
    }
  },
  // Plain JavaScript (the style entry point, this file) has no types to check.
  { files: ['**/*.js', '**/*.mjs'], ...tseslint.configs.disableTypeChecked },
  prettier
);
